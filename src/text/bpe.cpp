// Byte pair merging (bpe.h).
#include "text/bpe.h"

#include <cstddef>
#include <functional>
#include <queue>
#include <tuple>

namespace attn::text {

void bpe_merge_scan(const Vocabulary& v, std::string_view piece, std::vector<int64_t>& out) {
  // start[k]: where part k begins; start.back() == piece.size().
  // rank[k]: the rank of parts k and k+1 joined (kNoRank if not a token).
  const size_t n = piece.size();
  std::vector<size_t> start(n + 1);
  std::vector<uint32_t> rank(n + 1, kNoRank);
  for (size_t k = 0; k <= n; ++k) start[k] = k;
  auto joined_rank = [&](size_t k) {  // parts k and k+1, if both exist
    return k + 2 < start.size() ? v.rank_of(piece.substr(start[k], start[k + 2] - start[k])) : kNoRank;
  };
  for (size_t k = 0; k + 1 < n; ++k) rank[k] = joined_rank(k);
  for (;;) {
    uint32_t best = kNoRank;
    size_t at = 0;
    for (size_t k = 0; k + 1 < start.size(); ++k) {
      if (rank[k] < best) best = rank[k], at = k;
    }
    if (best == kNoRank) break;
    start.erase(start.begin() + static_cast<ptrdiff_t>(at + 1));
    rank.erase(rank.begin() + static_cast<ptrdiff_t>(at + 1));
    rank[at] = joined_rank(at);
    if (at > 0) rank[at - 1] = joined_rank(at - 1);
  }
  for (size_t k = 0; k + 1 < start.size(); ++k)
    out.push_back(v.find(piece.substr(start[k], start[k + 1] - start[k])));
}

void bpe_merge_heap(const Vocabulary& v, std::string_view piece, std::vector<int64_t>& out) {
  // Parts as a doubly linked list over byte positions: a part is named by
  // where it starts; end[s] is where it ends, prev[s] the start of the part
  // before it, alive[s] whether s still begins a part.
  const size_t n = piece.size();
  std::vector<size_t> end(n), prev(n);
  std::vector<bool> alive(n, true);
  for (size_t s = 0; s < n; ++s) end[s] = s + 1, prev[s] = s - 1;  // prev[0] unused
  // (rank, left start, right end): min rank first, then leftmost. An entry is
  // stale unless its left part is alive, and the part after it ends at the
  // recorded end (then the joined bytes are the same as when it was pushed).
  using Entry = std::tuple<uint32_t, size_t, size_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  auto push_pair = [&](size_t left) {
    const size_t right = end[left];
    if (right >= n) return;
    const uint32_t r = v.rank_of(piece.substr(left, end[right] - left));
    if (r != kNoRank) heap.emplace(r, left, end[right]);
  };
  for (size_t s = 0; s + 1 < n; ++s) push_pair(s);
  while (!heap.empty()) {
    const auto [r, left, right_end] = heap.top();
    heap.pop();
    const size_t right = end[left];
    if (!alive[left] || right >= n || end[right] != right_end) continue;
    // Join left and right.
    alive[right] = false;
    end[left] = right_end;
    if (right_end < n) prev[right_end] = left;
    if (left > 0) push_pair(prev[left]);
    push_pair(left);
  }
  for (size_t s = 0; s < n; s = end[s]) out.push_back(v.find(piece.substr(s, end[s] - s)));
}

}  // namespace attn::text
