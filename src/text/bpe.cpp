// Byte pair merging (bpe.h).
#include "text/bpe.h"

#include <cstddef>
#include <functional>
#include <queue>
#include <stdexcept>
#include <tuple>

namespace attn::text {

void bpe_merge_reference(const Vocabulary& v, std::string_view piece, std::vector<int64_t>& out) {
  // start[k]: where part k begins; start.back() == piece.size().
  // rank[k]: the rank of parts k and k+1 joined (kNoRank if not a token).
  const size_t n = piece.size();
  std::vector<size_t> start(n + 1);
  std::vector<uint32_t> rank(n + 1, kNoRank);
  for (size_t k = 0; k <= n; ++k) start[k] = k;
  auto joined_rank = [&](size_t k) {  // parts k and k+1, if both exist
    return k + 2 < start.size() ? v.rank_of(piece.substr(start[k], start[k + 2] - start[k]))
                                : kNoRank;
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

void bpe_merge_scan(const Vocabulary& v, std::string_view piece, std::vector<int64_t>& out) {
  // Parts 0..m-1: id[k] the token, join[k] the pair table's entry for parts
  // k and k+1 (nullptr: their bytes are no token).
  const size_t n = piece.size();
  if (n >= kHeapFromBytes) throw std::logic_error("bpe_merge_scan: piece too long for its arrays");
  int32_t id[kHeapFromBytes];
  const PairSlot* join[kHeapFromBytes];
  for (size_t k = 0; k < n; ++k) id[k] = v.byte_token[static_cast<unsigned char>(piece[k])];
  size_t m = n;
  for (size_t k = 0; k + 1 < m; ++k) join[k] = v.find_pair(id[k], id[k + 1]);
  join[m - 1] = nullptr;
  for (;;) {
    uint32_t best = kNoRank;
    size_t at = 0;
    for (size_t k = 0; k + 1 < m; ++k) {
      if (join[k] != nullptr && join[k]->rank < best) best = join[k]->rank, at = k;
    }
    if (best == kNoRank) break;
    id[at] = join[at]->id;
    for (size_t k = at + 1; k + 1 < m; ++k) id[k] = id[k + 1], join[k] = join[k + 1];
    --m;
    join[at] = at + 1 < m ? v.find_pair(id[at], id[at + 1]) : nullptr;
    if (at > 0) join[at - 1] = v.find_pair(id[at - 1], id[at]);
  }
  out.insert(out.end(), id, id + m);
}

void bpe_merge_heap(const Vocabulary& v, std::string_view piece, std::vector<int64_t>& out) {
  // Parts as a doubly linked list over byte positions: a part is named by
  // where it starts; end[s] is where it ends, prev[s] the start of the part
  // before it, id[s] its token, alive[s] whether s still begins a part.
  const size_t n = piece.size();
  std::vector<size_t> end(n), prev(n);
  std::vector<int32_t> id(n);
  std::vector<bool> alive(n, true);
  for (size_t s = 0; s < n; ++s) {
    end[s] = s + 1;
    prev[s] = s - 1;  // prev[0] unused
    id[s] = v.byte_token[static_cast<unsigned char>(piece[s])];
  }
  // (rank, left start, right end, joined id): min rank first, then leftmost.
  // An entry is stale unless its left part is alive and the part after it
  // ends at the recorded end (then the joined bytes are the same as when it
  // was pushed).
  using Entry = std::tuple<uint32_t, size_t, size_t, int32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  auto push_pair = [&](size_t left) {
    const size_t right = end[left];
    if (right >= n) return;
    const PairSlot* p = v.find_pair(id[left], id[right]);
    if (p != nullptr) heap.emplace(p->rank, left, end[right], p->id);
  };
  for (size_t s = 0; s + 1 < n; ++s) push_pair(s);
  while (!heap.empty()) {
    const auto [r, left, right_end, joined] = heap.top();
    heap.pop();
    const size_t right = end[left];
    if (!alive[left] || right >= n || end[right] != right_end) continue;
    alive[right] = false;
    end[left] = right_end;
    id[left] = joined;
    if (right_end < n) prev[right_end] = left;
    if (left > 0) push_pair(prev[left]);
    push_pair(left);
  }
  for (size_t s = 0; s < n; s = end[s]) out.push_back(id[s]);
}

}  // namespace attn::text
