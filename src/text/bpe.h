// src/text/bpe.h - byte pair merging of one piece, as tiktoken does it.
//
// Start from the piece's bytes; repeatedly join the adjacent pair whose joined
// bytes form the mergeable token of lowest rank (the leftmost such pair on a
// tie) until no adjacent pair joins into a token; the parts are the tokens.
//   bpe_merge_reference  tiktoken's loop itself: ranks looked up by the joined
//                        bytes, O(n^2); the specification the others are tested
//                        against.
//   bpe_merge_scan       the same loop on token ids, ranks from the pair table
//                        (Vocabulary::find_pair), in fixed arrays; short pieces.
//   bpe_merge_heap       the same result in O(n log n) with a priority queue;
//                        long pieces.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "text/vocabulary.h"

namespace attn::text {

// Each appends the ids of `piece` (at least one byte) to out.
void bpe_merge_reference(const Vocabulary& v, std::string_view piece, std::vector<int64_t>& out);
void bpe_merge_scan(const Vocabulary& v, std::string_view piece,
                    std::vector<int64_t>& out);  // < kHeapFromBytes
void bpe_merge_heap(const Vocabulary& v, std::string_view piece, std::vector<int64_t>& out);

// The one encode uses: the scan for short pieces, the heap for long ones.
constexpr size_t kHeapFromBytes = 64;
inline void bpe_merge(const Vocabulary& v, std::string_view piece, std::vector<int64_t>& out) {
  if (piece.size() < kHeapFromBytes)
    bpe_merge_scan(v, piece, out);
  else
    bpe_merge_heap(v, piece, out);
}

}  // namespace attn::text
