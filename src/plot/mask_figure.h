// mask_figure.h - the figures of `attn plot mask`: which keys each query may
// attend to under each of scaled_dot_product_attention's rules (attn/sdpa.h),
// drawn as the walkthrough draws attention (queries down, keys across).
//
// Nothing here restates the rules: every picture is read off the reference
// implementation (SdpaBackend::kReference). With every score equal (q = k = 0)
// and v the identity (Dv = Tk, v[j] = e_j), the output row i IS the softmax
// row P[i, :]: 1/n on the n keys query i may see, exactly 0 on the rest (drawn
// as masked). With a bias (ALiBi) the scores come back as s[i, j] = log P[i, j]
// + lse[i]. The GQA picture asks the same of the heads: one query and one key
// per head, v of kv head g the one-hot e_g, so query head h's output names the
// kv head it reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plot/heatmap.h"

namespace attn::plot {

enum class MaskKind {
  kCausal,             // is_causal, top-left (PyTorch): query i sees j <= i
  kCausalBottomRight,  // is_causal, bottom-right (FlashAttention 2, a KV cache): j <= i + Tk - Tq
  kWindow,             // causal with window_left: i + δ - w <= j <= i + δ
  kAlibi,              // causal + ALiBi, one panel per head: the bias -slope_h · (i + δ - j)
  kVarlen,             // packed sequences (cu_seqlens), causal within each: blocks on the diagonal
  kGqa,                // grouped-query heads: query head h reads kv head h / (Hq / Hkv)
};

// "causal", "causal-bottom-right", "window", "alibi", "varlen", "gqa".
const char* mask_kind_name(MaskKind kind);
// The inverse; throws std::invalid_argument naming the name and the choices.
MaskKind mask_kind_from_name(const std::string& name);

struct MaskFigureOptions {
  MaskKind kind = MaskKind::kCausal;
  int64_t tq = 8, tk = 8;             // queries, keys
  int64_t window_left = 3;            // kWindow: keys before the diagonal (>= 0)
  int64_t heads = 4;                  // kAlibi: panels; kGqa: query heads
  int64_t kv_heads = 2;               // kGqa: key/value heads (heads a multiple of it)
  std::vector<int64_t> seqlens;       // kVarlen: the packed sequences' lengths (>= 1)
};

// The ALiBi slopes of Press et al. for H heads: 2^(-8 (h + 1) / H), h = 0..H-1.
std::vector<float> alibi_slopes(int64_t heads);

// Throws std::invalid_argument naming the values when the options do not make a
// picture (sizes < 1, more than 64 cells a side, heads not a multiple of kv_heads,
// a window < 0, no seqlens or one < 1, or more than 64 tokens packed).
Figure mask_figure(const MaskFigureOptions& options);

}  // namespace attn::plot
