// Decode attention, the specification (attn/decode_attention.h): sequence b's
// Tq_b new queries, the last Tq_b positions of the sequence, over the first
// L_b rows of its key/value cache (dense or paged); query head h reads kv head
// h / (Hq / Hkv). For query t at position p = L_b - Tq_b + t:
//   visible keys  j in [max(0, p - window_left), p]   (window_left = -1: [0, p])
//   s_j = scale · q · k_j, then softcap · tanh(s_j / softcap), then - slope_h · (p - j)
//   out = Σ_j exp(s_j - max s) · v_j / Σ_j exp(s_j - max s)
// One row at a time, keys in order, all in fp32 (bf16 inputs widened exactly,
// out rounded to bf16 once). The kernel (src/kernels/decode_attention.cpp)
// computes the same by chunks of keys combined by log-sum-exp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/decode_attention.h"
#include "attn/tensor.h"

namespace attn {

DecodeProblem validated(const DecodeProblem& p) {
  const auto fail = [&](const std::string& why) {
    throw std::invalid_argument(fmt::format(
        "decode_attention: {}; got B = {}, Hq = {}, Hkv = {}, Tq = {}, length = {}, capacity = "
        "{}, D = {}, Dv = {}, window_left = {}, softcap = {}, q_stride = {}, o_stride = {}, "
        "q_batch_stride = {}, o_batch_stride = {}, scale = {}{}{}",
        why, p.B, p.Hq, p.Hkv, p.Tq, p.length, p.capacity, p.D, p.Dv, p.window_left, p.softcap,
        p.q_stride, p.o_stride, p.q_batch_stride, p.o_batch_stride, p.scale,
        p.cu_seqlens_q || p.cache_seqlens ? " (sequences of their own lengths)" : "",
        p.block_table
            ? fmt::format(", page_block_size = {}, block_table_stride = {}, num_pages = {}",
                          p.page_block_size, p.block_table_stride, p.num_pages)
            : std::string()));
  };
  if (p.B < 1 || p.Hq < 1 || p.Hkv < 1 || p.D < 1) fail("need B, Hq, Hkv, D >= 1");
  if (p.Dv < 0) fail("need Dv = 0 (= D) or >= 1");
  if (p.Hq % p.Hkv != 0) fail("need Hq a multiple of Hkv");
  if (p.window_left < -1) fail("need window_left = -1 (unbounded) or >= 0");
  if (!std::isfinite(p.scale)) fail("need a finite scale");
  if (!(p.softcap >= 0.0f) || !std::isfinite(p.softcap)) fail("need softcap 0 (off) or > 0");
  if (p.alibi_slopes != nullptr) {
    for (int64_t h = 0; h < p.Hq; ++h) {
      if (!std::isfinite(p.alibi_slopes[h]))
        fail(fmt::format("need finite ALiBi slopes, slope {} is {}", h, p.alibi_slopes[h]));
    }
  }
  DecodeProblem r = p;
  if (r.Dv == 0) r.Dv = p.D;
  // The sequences' queries and keys.
  if (p.cu_seqlens_q != nullptr) {
    if (p.cu_seqlens_q[0] != 0)
      fail(fmt::format("need cu_seqlens_q[0] = 0, got {}", p.cu_seqlens_q[0]));
    r.Tq = 0;
    for (int64_t b = 0; b < p.B; ++b) {
      const int64_t n = p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
      if (n < 1) {
        fail(fmt::format("need cu_seqlens_q increasing, got cu_seqlens_q[{}] = {} then {}", b,
                         p.cu_seqlens_q[b], p.cu_seqlens_q[b + 1]));
      }
      r.Tq = std::max(r.Tq, n);
    }
  } else if (p.Tq < 1) {
    fail("need Tq >= 1");
  }
  const bool paged = p.block_table != nullptr;
  if (paged && (p.page_block_size < 1 || p.block_table_stride < 1 || p.num_pages < 1)) {
    fail("need page_block_size, block_table_stride and num_pages >= 1 with a block table");
  }
  const int64_t rows = paged ? p.page_block_size * p.block_table_stride : p.capacity;
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t n = decode_queries(r, b), L = decode_keys(r, b);
    if (L < n || L > rows) {
      fail(
          fmt::format("need Tq <= length <= {} for every sequence, sequence {} has {} queries "
                      "and {} keys",
                      paged ? "the pages of its table" : "capacity", b, n, L));
    }
    if (paged) {
      for (int64_t i = 0; i < (L + p.page_block_size - 1) / p.page_block_size; ++i) {
        const int32_t page = p.block_table[b * p.block_table_stride + i];
        if (page < 0 || page >= p.num_pages) {
          fail(fmt::format("need page ids in [0, num_pages), sequence {} page {} is {}", b, i,
                           page));
        }
      }
    }
  }
  // q and out.
  if (r.q_stride == 0) r.q_stride = p.Hq * p.D;
  if (r.o_stride == 0) r.o_stride = p.Hq * r.Dv;
  if (r.q_stride < p.Hq * p.D || r.o_stride < p.Hq * r.Dv)
    fail("need q_stride and o_stride 0 (packed) or >= Hq·D and Hq·Dv");
  if (r.q_batch_stride == 0) r.q_batch_stride = r.Tq * r.q_stride;
  if (r.o_batch_stride == 0) r.o_batch_stride = r.Tq * r.o_stride;
  if (p.cu_seqlens_q == nullptr &&
      (r.q_batch_stride < p.Tq * r.q_stride || r.o_batch_stride < p.Tq * r.o_stride))
    fail("need q_batch_stride and o_batch_stride 0 (packed) or >= Tq times the row stride");
  // The cache: defaults, then no two rows or heads at the same place.
  const int64_t extent = paged ? p.page_block_size : p.capacity;  // rows in one run
  const auto cache = [&](DecodeCacheStrides& c, int64_t width, const char* name) {
    if (c.row < 0 || c.head < 0 || c.batch < 0 || c.block < 0)
      fail(fmt::format("need {} strides >= 0", name));
    if (paged) {
      if (c.row == 0) c.row = p.Hkv * width;
      if (c.head == 0) c.head = width;
    } else {
      if (c.row == 0) c.row = width;
      if (c.head == 0) c.head = extent * c.row;
    }
    // The elements one sequence (dense) or one page (paged) reaches.
    const int64_t span = std::max(c.head * (p.Hkv - 1) + width, c.row * (extent - 1) + width);
    const int64_t packed = std::max(c.head * p.Hkv, c.row * extent);
    if (c.block == 0) c.block = packed;
    if (c.batch == 0) c.batch = packed;
    const bool rows_apart = c.row >= width || extent == 1;
    const bool heads_apart = p.Hkv == 1 || c.head >= c.row * (extent - 1) + width ||
                             (c.head >= width && c.row >= c.head * (p.Hkv - 1) + width);
    const int64_t outer = paged ? c.block : c.batch;  // between pages or sequences
    const bool outer_apart = outer >= span || (paged ? p.num_pages == 1 : p.B == 1);
    if (!rows_apart || !heads_apart || !outer_apart) {
      fail(fmt::format("need {} strides that keep rows and heads apart, got row {}, head {}, {} {}",
                       name, c.row, c.head, paged ? "block" : "batch", paged ? c.block : c.batch));
    }
  };
  cache(r.k_strides, p.D, "key");
  cache(r.v_strides, r.Dv, "value");
  return r;
}

namespace ref {
namespace {

float widen(float x) { return x; }
float widen(BFloat16 x) { return to_float(x); }
void store(float* o, float x) { *o = x; }
void store(BFloat16* o, float x) { *o = to_bfloat16(x); }

// TQ: q and out; TKV: keys and values (float or BFloat16).
template <class TQ, class TKV>
void forward(TQ* out, const TQ* q, const TKV* keys, const TKV* values, const DecodeProblem& p_in) {
  const DecodeProblem p = validated(p_in);
  const int64_t G = p.Hq / p.Hkv, D = p.D, Dv = p.Dv;
  std::vector<float> s, o(static_cast<size_t>(Dv));
  for (int64_t b = 0; b < p.B; ++b) {
    const int64_t Tq = decode_queries(p, b), L = decode_keys(p, b);
    for (int64_t t = 0; t < Tq; ++t) {
      const int64_t pos = L - Tq + t;  // this query's position
      const int64_t j0 = p.window_left < 0 ? 0 : std::max<int64_t>(0, pos - p.window_left);
      for (int64_t h = 0; h < p.Hq; ++h) {
        const TQ* qh = q + decode_q_offset(p, b, t) + h * D;
        s.assign(size_t(pos + 1 - j0), 0.0f);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = j0; j <= pos; ++j) {
          const TKV* k = keys + decode_cache_offset(p, p.k_strides, b, h / G, j);
          float dot = 0.0f;
          for (int64_t i = 0; i < D; ++i) dot += widen(qh[i]) * widen(k[i]);
          float x = p.scale * dot;
          if (p.softcap > 0.0f) x = p.softcap * std::tanh(x / p.softcap);
          if (p.alibi_slopes != nullptr) x += -p.alibi_slopes[h] * static_cast<float>(pos - j);
          s[size_t(j - j0)] = x;
          m = std::max(m, x);
        }
        float l = 0.0f;
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t j = j0; j <= pos; ++j) {
          const TKV* v = values + decode_cache_offset(p, p.v_strides, b, h / G, j);
          const float e = std::exp(s[size_t(j - j0)] - m);
          l += e;
          for (int64_t i = 0; i < Dv; ++i) o[size_t(i)] += e * widen(v[i]);
        }
        TQ* oh = out + decode_o_offset(p, b, t) + h * Dv;
        for (int64_t i = 0; i < Dv; ++i) store(oh + i, o[size_t(i)] / l);
      }
    }
  }
}

}  // namespace

void decode_attention_forward(float* out, const float* q, const float* keys, const float* values,
                              const DecodeProblem& p) {
  forward(out, q, keys, values, p);
}

void decode_attention_forward(float* out, const float* q, const BFloat16* keys,
                              const BFloat16* values, const DecodeProblem& p) {
  forward(out, q, keys, values, p);
}

void decode_attention_forward_bf16(BFloat16* out, const BFloat16* q, const BFloat16* keys,
                                   const BFloat16* values, const DecodeProblem& p) {
  forward(out, q, keys, values, p);
}

}  // namespace ref
}  // namespace attn
