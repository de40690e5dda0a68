// The figures of `attn plot mask` (mask_figure.h), read off the reference sdpa.
#include "plot/mask_figure.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "attn/sdpa.h"
#include "attn/tensor.h"
#include "attn/utf8.h"

namespace attn::plot {
namespace {

constexpr int64_t kMaxSide = 64;  // cells on a side: beyond this a picture says nothing more

struct KindName {
  MaskKind kind;
  const char* name;
};
constexpr KindName kKindNames[] = {{MaskKind::kCausal, "causal"},
                                   {MaskKind::kCausalBottomRight, "causal-bottom-right"},
                                   {MaskKind::kWindow, "window"},
                                   {MaskKind::kAlibi, "alibi"},
                                   {MaskKind::kVarlen, "varlen"},
                                   {MaskKind::kGqa, "gqa"}};

// The softmax rows and lse of heads H (H / Hkv per kv head) with every score 0
// before the options' bias and band: out (1, H, Tq, Tk) = P, lse (1, H, Tq).
SdpaForward uniform_scores(int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, SdpaOptions options) {
  const Tensor q = Tensor::zeros({1, H, Tq, 1});
  const Tensor k = Tensor::zeros({1, Hkv, Tk, 1});
  std::vector<float> eye(static_cast<size_t>(Hkv * Tk * Tk), 0.0f);  // v[g, j] = e_j
  for (int64_t g = 0; g < Hkv; ++g)
    for (int64_t j = 0; j < Tk; ++j) eye[static_cast<size_t>((g * Tk + j) * Tk + j)] = 1.0f;
  const Tensor v({1, Hkv, Tk, Tk}, std::move(eye));
  options.backend = SdpaBackend::kReference;
  options.enable_gqa = H != Hkv;
  return scaled_dot_product_attention_forward(q, k, v, options);
}

std::vector<std::string> labels(const char* prefix, int64_t n) {
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(fmt::format("{}{}", prefix, i));
  return out;
}

// Panel h of P (1, H, Tq, Tk): the weights, or with scores the recovered
// s = log P + lse; a weight of exactly 0 is masked.
Panel softmax_panel(const SdpaForward& f, int64_t h, bool scores, std::string title) {
  const int64_t Tq = f.out.size(2), Tk = f.out.size(3);
  Panel p;
  p.title = std::move(title), p.rows = Tq, p.cols = Tk;
  const Tensor P = f.out.contiguous(), lse = f.lse.contiguous();
  const float* w = P.data_ptr<float>() + h * Tq * Tk;
  const float* l = lse.data_ptr<float>() + h * Tq;
  for (int64_t i = 0; i < Tq; ++i) {
    for (int64_t j = 0; j < Tk; ++j) {
      const float x = w[i * Tk + j];
      p.masked.push_back(x == 0.0f);
      p.values.push_back(x == 0.0f ? 0.0f : scores ? std::log(x) + l[i] : x);
    }
  }
  p.row_labels = labels("q", Tq);
  p.col_labels = labels("k", Tk);
  return p;
}

void check_side(const char* what, int64_t n) {
  if (n < 1 || n > kMaxSide)
    throw std::invalid_argument(
        fmt::format("plot mask: {} must be between 1 and {}, got {}", what, kMaxSide, n));
}

}  // namespace

const char* mask_kind_name(MaskKind kind) {
  for (const auto& [k, name] : kKindNames)
    if (k == kind) return name;
  return "unknown";
}

MaskKind mask_kind_from_name(const std::string& name) {
  std::string choices;
  for (const auto& [k, n] : kKindNames) {
    if (name == n) return k;
    choices += fmt::format("{}{}", choices.empty() ? "" : ", ", n);
  }
  throw std::invalid_argument(
      fmt::format("plot mask: unknown kind '{}' (choose {})", printable(name), choices));
}

std::vector<float> alibi_slopes(int64_t heads) {
  std::vector<float> s;
  for (int64_t h = 0; h < heads; ++h)
    s.push_back(static_cast<float>(std::exp2(-8.0 * double(h + 1) / double(heads))));
  return s;
}

Figure mask_figure(const MaskFigureOptions& o) {
  Figure f;
  SdpaOptions s;
  switch (o.kind) {
    case MaskKind::kCausal:
    case MaskKind::kCausalBottomRight: {
      check_side("--tq", o.tq), check_side("--tk", o.tk);
      const bool br = o.kind == MaskKind::kCausalBottomRight;
      s.is_causal = true;
      s.causal_alignment = br ? CausalAlignment::kBottomRight : CausalAlignment::kTopLeft;
      f.title = br ? fmt::format("is_causal, bottom-right (FlashAttention 2, a KV cache): query i "
                                 "sees keys j <= i + {}; weights with equal scores",
                                 o.tk - o.tq)
                   : "is_causal, top-left (PyTorch): query i sees keys j <= i; weights with equal "
                     "scores";
      f.panels.push_back(softmax_panel(uniform_scores(1, 1, o.tq, o.tk, s), 0, false,
                                       fmt::format("Tq = {}, Tk = {}", o.tq, o.tk)));
      f.vmin = 0.0, f.vmax = 1.0;
      return f;
    }
    case MaskKind::kWindow: {
      check_side("--tq", o.tq), check_side("--tk", o.tk);
      if (o.window_left < 0)
        throw std::invalid_argument(
            fmt::format("plot mask: window_left must be >= 0, got {}", o.window_left));
      s.is_causal = true;
      s.causal_alignment = CausalAlignment::kBottomRight;
      s.window_left = o.window_left;
      f.title = fmt::format(
          "sliding window of {} keys, window_left = {} (causal, bottom-right): query i sees "
          "keys i + {} - {} <= j <= i + {}; weights with equal scores",
          o.window_left + 1, o.window_left, o.tk - o.tq, o.window_left, o.tk - o.tq);
      f.panels.push_back(softmax_panel(uniform_scores(1, 1, o.tq, o.tk, s), 0, false,
                                       fmt::format("Tq = {}, Tk = {}", o.tq, o.tk)));
      f.vmin = 0.0, f.vmax = 1.0;
      return f;
    }
    case MaskKind::kAlibi: {
      check_side("--tq", o.tq), check_side("--tk", o.tk), check_side("--heads", o.heads);
      s.is_causal = true;
      s.causal_alignment = CausalAlignment::kBottomRight;
      const std::vector<float> slopes = alibi_slopes(o.heads);
      s.alibi_slopes = Tensor({o.heads}, std::vector<float>(slopes));
      const SdpaForward r = uniform_scores(o.heads, o.heads, o.tq, o.tk, s);
      for (int64_t h = 0; h < o.heads; ++h)
        f.panels.push_back(
            softmax_panel(r, h, true, fmt::format("head {}, slope {:.4g}", h, slopes[size_t(h)])));
      f.title = fmt::format(
          "ALiBi bias -slope_h * (i + {} - j) on the causal band, {} heads (slopes 2^(-8(h+1)/{}))",
          o.tk - o.tq, o.heads, o.heads);
      fit_scale(f);
      return f;
    }
    case MaskKind::kVarlen: {
      if (o.seqlens.empty())
        throw std::invalid_argument("plot mask: --seqlens needs at least one length");
      std::vector<int64_t> cu = {0};
      int64_t longest = 0;
      for (const int64_t n : o.seqlens) {
        if (n < 1)
          throw std::invalid_argument(
              fmt::format("plot mask: every --seqlens length must be >= 1, got {}", n));
        cu.push_back(cu.back() + n);
        longest = std::max(longest, n);
        check_side("the packed tokens (the sum of --seqlens)", cu.back());
      }
      const int64_t T = cu.back();
      // Packed (T, 1, 1) zeros; v (T, 1, T) the identity over the packed tokens.
      std::vector<float> eye(static_cast<size_t>(T * T), 0.0f);
      for (int64_t j = 0; j < T; ++j) eye[static_cast<size_t>(j * T + j)] = 1.0f;
      SdpaOptions vs;
      vs.backend = SdpaBackend::kReference;
      vs.is_causal = true;
      const Tensor cu_t = Tensor::from_int64({int64_t(cu.size())}, cu);
      const SdpaForward r =
          sdpa_varlen_forward(Tensor::zeros({T, 1, 1}), Tensor::zeros({T, 1, 1}),
                              Tensor({T, 1, T}, eye), cu_t, cu_t, longest, longest, vs);
      // As (1, 1, T, T) for softmax_panel: out (T, 1, T) is row-major (T, T) already.
      SdpaForward as_one{.out = r.out.contiguous().view({1, 1, T, T}),
                         .lse = Tensor::zeros({1, 1, T})};
      std::string lens;
      for (const int64_t n : o.seqlens) lens += fmt::format("{}{}", lens.empty() ? "" : ", ", n);
      f.panels.push_back(softmax_panel(as_one, 0, false, fmt::format("{} packed tokens", T)));
      f.title = fmt::format(
          "variable-length batch (cu_seqlens), sequences of {} packed, causal within each: a "
          "query sees only its own sequence's keys",
          lens);
      f.vmin = 0.0, f.vmax = 1.0;
      return f;
    }
    case MaskKind::kGqa: {
      check_side("--heads", o.heads), check_side("--kv-heads", o.kv_heads);
      if (o.heads % o.kv_heads != 0)
        throw std::invalid_argument(
            fmt::format("plot mask: --heads {} is not a multiple of --kv-heads {}", o.heads,
                        o.kv_heads));
      // One query and one key per head; v of kv head g = e_g (Dv = Hkv), so
      // query head h's output row is e_(its kv head).
      const int64_t H = o.heads, G = o.kv_heads;
      std::vector<float> onehot(static_cast<size_t>(G * G), 0.0f);
      for (int64_t g = 0; g < G; ++g) onehot[static_cast<size_t>(g * G + g)] = 1.0f;
      SdpaOptions gs;
      gs.backend = SdpaBackend::kReference;
      gs.enable_gqa = true;
      const Tensor out = scaled_dot_product_attention(Tensor::zeros({1, H, 1, 1}),
                                                      Tensor::zeros({1, G, 1, 1}),
                                                      Tensor({1, G, 1, G}, std::move(onehot)), gs)
                             .contiguous();  // (1, H, 1, G)
      Panel p;
      p.title = fmt::format("{} query heads, {} kv heads", H, G), p.rows = H, p.cols = G;
      const float* x = out.data_ptr<float>();
      for (int64_t i = 0; i < H * G; ++i) {
        p.values.push_back(x[i]);
        p.masked.push_back(x[i] == 0.0f);
      }
      p.row_labels = labels("q head ", H);
      p.col_labels = labels("kv ", G);
      f.title = fmt::format(
          "grouped-query attention (enable_gqa): query head h reads kv head h / {} ({} heads "
          "share each key and value)",
          H / G, H / G);
      f.panels.push_back(std::move(p));
      f.vmin = 0.0, f.vmax = 1.0;
      return f;
    }
  }
  throw std::invalid_argument("plot mask: unknown kind");
}

}  // namespace attn::plot
