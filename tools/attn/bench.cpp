// bench.cpp - `attn bench`: the table of docs/performance.md, the JSON rows
// bench/compare_torch.py reads, and the T = 16384 memory check (bench.h says
// what is timed and how FLOPs are counted; bench_machine.h the machine they
// are measured against, the header above the table).
#include "bench.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attn/decode_kernels.h"
#include "attn/fused.h"
#include "attn/gemm.h"
#include "attn/kernels.h"
#include "attn/nn.h"
#include "attn/random.h"
#include "attn/sdpa.h"
#include "attn/utf8.h"
#include "bench_decode.h"
#include "bench_machine.h"
#include "flag_checks.h"
#include "sgemm_rate.h"

namespace attn::cli {
namespace {

using Clock = std::chrono::steady_clock;

const std::vector<std::string> kDefaultShapes = {"1x256x768x12",  "1x1024x768x12", "1x4096x768x12",
                                                 "8x1024x768x12", "1x1024x768x6",  "1x4096x768x6"};
const std::vector<std::string> kQuickShapes = {"1x256x768x12", "1x1024x768x12", "1x1024x768x6"};

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<float> normal_values(int64_t n, uint64_t seed) {
  Generator gen(seed);
  const Tensor t = randn({n}, gen);
  return t.to_vector();
}

int64_t head_dim_of(const BenchCase& c) { return c.d_model / c.heads; }

bool is_sdpa(const std::string& kind) { return kind == "sdpa" || kind == "sdpa-varlen"; }

// The lengths of an sdpa-varlen row's sequences: --seqlens, or B sequences of T.
std::vector<int64_t> varlen_lengths(const BenchCase& c) {
  return c.seqlens.empty() ? std::vector<int64_t>(size_t(c.B), c.T) : c.seqlens;
}

// The largest sizes a bench case takes (issue 46), and the memory its tensors may hold.
constexpr int64_t kMaxBenchBatch = 65536;
constexpr int64_t kMaxBenchTokens = int64_t{1} << 20;
constexpr int64_t kMaxBenchWidth = 65536;  // --d-model, --head-dim
constexpr int64_t kMaxBenchHeads = 4096;
constexpr int64_t kMaxBenchBytes = int64_t{64} << 30;

// --mask: none (no mask), bool, float or padded (SdpaBenchProblem builds each).
void check_mask(const std::string& mask) {
  if (mask != "none" && mask != "bool" && mask != "float" && mask != "padded")
    throw UsageError(
        fmt::format("bench: --mask must be bool, float or padded, got '{}'", printable(mask)));
}

void check_case(const BenchCase& c) {
  if (c.kind != "core" && c.kind != "module" && !is_sdpa(c.kind))
    throw UsageError(fmt::format(
        "bench: --kind must be core, module, sdpa or sdpa-varlen, got '{}'", printable(c.kind)));
  if (c.mode != "fwd" && c.mode != "fwdbwd")
    throw UsageError(fmt::format("bench: --mode must be fwd or fwdbwd, got '{}'", c.mode));
  if (c.dtype != "float32" && c.dtype != "bfloat16")
    throw UsageError(
        fmt::format("bench: --dtype must be float32, bfloat16 or all, got '{}'", c.dtype));
  check_mask(c.mask);
  if (c.kv_heads < 0 || (c.kv_heads > 0 && c.heads % c.kv_heads != 0))
    throw UsageError(
        fmt::format("bench: --kv-heads must divide --heads {}, got {}", c.heads, c.kv_heads));
  if (c.query_tokens < 0)
    throw UsageError(fmt::format("bench: --query-tokens must be >= 1, got {}", c.query_tokens));
  if (c.B < 1 || c.T < 1 || c.d_model < 1 || c.heads < 1 || c.d_model % c.heads != 0) {
    throw UsageError(fmt::format(
        "bench: need B, T, d_model, heads >= 1 and d_model divisible by heads, got B={} T={} "
        "d_model={} heads={}",
        c.B, c.T, c.d_model, c.heads));
  }
  if (c.B > kMaxBenchBatch || c.T > kMaxBenchTokens || c.d_model > kMaxBenchWidth ||
      c.heads > kMaxBenchHeads) {
    throw UsageError(fmt::format(
        "bench: need B <= {}, T <= {}, d_model <= {}, heads <= {}, got B={} T={} d_model={} "
        "heads={}",
        kMaxBenchBatch, kMaxBenchTokens, kMaxBenchWidth, kMaxBenchHeads, c.B, c.T, c.d_model,
        c.heads));
  }
  // The tensors a case holds at once, roughly: x, q, k, v, the output and their gradients,
  // 8 float32 tensors of B·T·D (every kind runs the fused kernels: no B·H·T·T scores are
  // kept, docs/sdpa.md), and an sdpa row's dense (T, T) mask. Counted in double: the
  // products of bounded sizes overflow int64.
  const double activations = 8.0 * double(c.B) * double(c.T) * double(c.d_model);
  const double mask = is_sdpa(c.kind) && c.mask != "none" ? double(c.T) * double(c.T) : 0.0;
  const double bytes = 4.0 * (activations + mask);
  if (bytes > double(kMaxBenchBytes)) {
    throw UsageError(fmt::format(
        "bench: the shape {}x{}x{}x{} would hold about {:.0f} GiB, more than the limit of {} GiB",
        c.B, c.T, c.d_model, c.heads, bytes / double(int64_t{1} << 30), kMaxBenchBytes >> 30));
  }
}

// The query-key pairs an sdpa row attends: Σ_i |[max(0, i - w), min(i, Tk - 1)]|
// (causal, or a dense mask of the causal pattern), Tq·Tk without is_causal, and
// the core's T²/2 for the plain causal square.
double sdpa_pairs(const BenchCase& c) {
  const int64_t Tq = c.query_tokens > 0 ? c.query_tokens : c.T, Tk = c.T;
  const bool causal = c.causal || c.mask != "none";
  if (!causal && c.window_left < 0) return double(Tq) * double(Tk);
  // The plain causal square (is_causal or its dense mask): the core's T²/2, so
  // that its rows and the core's compare.
  if (Tq == Tk && c.window_left < 0) return double(Tk) * double(Tk) / 2.0;
  double pairs = 0;
  for (int64_t i = 0; i < Tq; ++i) {
    const int64_t hi = causal ? std::min(i, Tk - 1) : Tk - 1;
    const int64_t lo = c.window_left >= 0 ? std::max<int64_t>(0, i - c.window_left) : 0;
    if (hi >= lo) pairs += double(hi - lo + 1);
  }
  return pairs;
}

// The useful causal FLOPs of one repeat (bench.h).
double case_flops(const BenchCase& c) {
  const bool fwd = c.mode == "fwd";
  if (c.kind == "core" || is_sdpa(c.kind)) {
    // Query-key pairs: T²/2 causal; for sdpa, counted row by row (its band, Tq != Tk);
    // for sdpa-varlen, the sum over its sequences (each a causal square of its length).
    double pairs = double(c.B) * double(c.T) * double(c.T) / 2.0;
    if (c.kind == "sdpa") pairs = double(c.B) * sdpa_pairs(c);
    if (c.kind == "sdpa-varlen") {
      pairs = 0.0;
      for (const int64_t T : varlen_lengths(c)) {
        BenchCase one = c;
        one.T = T, one.query_tokens = 0, one.mask = "none", one.causal = true;
        pairs += sdpa_pairs(one);
      }
    }
    const double core = 4.0 * pairs * double(c.d_model);
    return fwd ? core : 3.5 * core;
  }
  const double f = fused::attention_block_forward_flops(c.B, c.T, c.d_model, c.d_model, true, true);
  return fwd ? f
             : f + fused::attention_block_backward_flops(c.B, c.T, c.d_model, c.d_model, true,
                                                         true);
}

// ---- the two things timed ---------------------------------------------------------------

// Buffers of 2 MiB and more start on a 2 MiB boundary with transparent huge
// pages asked for (MADV_HUGEPAGE), as attn::Tensor's storage does
// (src/tensor/storage_cache.cpp): the core then reads what the module's
// tensors give it. The kernel reads one head's row of each token, a row per
// 4 KB page, so with small pages every row costs a TLB walk: T = 4096 on this
// Xeon (a KVM guest), 1 thread, ~5% of the forward and of forward+backward.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  explicit HugePageAllocator(const HugePageAllocator<U>&) {}
  T* allocate(size_t n) {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t bytes = n * sizeof(T);
    void* p = nullptr;
    if (posix_memalign(&p, bytes >= kHuge ? kHuge : 64, std::max<size_t>(bytes, 1)) != 0)
      throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    if (bytes >= kHuge) madvise(p, bytes, MADV_HUGEPAGE);  // a hint
#endif
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};
template <class T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

// The flash kernel alone on packed (B, T, H, hd) buffers, in float32 or bfloat16.
struct CoreProblem {
  kernels::FlashAttentionParams p;
  bool bf16 = false;
  HugeVector<float> q, k, v, out, lse, dout, dq, dk, dv;
  HugeVector<BFloat16> qb, kb, vb, outb, doutb, dqb, dkb, dvb;  // bf16: these instead
  explicit CoreProblem(const BenchCase& c) : bf16(c.dtype == "bfloat16") {
    p.B = c.B, p.T = c.T, p.H = c.heads, p.hd = head_dim_of(c), p.causal = true;
    const int64_t n = c.B * c.T * c.d_model;
    auto values = [&](uint64_t seed, HugeVector<float>& f, HugeVector<BFloat16>& b) {
      if (!bf16) {
        const std::vector<float> x = normal_values(n, seed);
        f.assign(x.begin(), x.end());
        return;
      }
      for (const float x : normal_values(n, seed)) b.push_back(to_bfloat16(x));
    };
    values(1, q, qb), values(2, k, kb), values(3, v, vb), values(4, dout, doutb);
    if (bf16) {
      outb.assign(size_t(n), BFloat16{}), dqb = dkb = dvb = outb;
    } else {
      out.assign(size_t(n), 0.0f), dq = dk = dv = out;
    }
    lse.assign(size_t(c.B * c.heads * c.T), 0.0f);
  }
  void forward() {
    if (bf16)
      kernels::flash_attention_forward_bf16(outb.data(), lse.data(), qb.data(), kb.data(),
                                            vb.data(), p);
    else
      kernels::flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), p);
  }
  void backward() {
    if (bf16)
      kernels::flash_attention_backward_bf16(dqb.data(), dkb.data(), dvb.data(), doutb.data(),
                                             qb.data(), kb.data(), vb.data(), outb.data(),
                                             lse.data(), p);
    else
      kernels::flash_attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                        k.data(), v.data(), out.data(), lse.data(), p);
  }
  // The output and (after backward) dq are finite.
  bool finite(bool backward) const {
    auto ok = [](const auto& x) {
      for (const auto& e : x) {
        float f;
        if constexpr (std::is_same_v<std::decay_t<decltype(e)>, BFloat16>)
          f = to_float(e);
        else
          f = e;
        if (!std::isfinite(f)) return false;
      }
      return true;
    };
    if (bf16) return ok(outb) && (!backward || (ok(dqb) && ok(dkb) && ok(dvb)));
    return ok(out) && (!backward || (ok(dq) && ok(dk) && ok(dv)));
  }
};

// scaled_dot_product_attention (attn/sdpa.h) on the core's problem: packed
// (B, T, H, hd) values read as (B, H, T, hd) views (token-major strides, no
// copies), is_causal; the fused kernel, or the plain reference with --backend
// reference; float32 or bfloat16 (the values rounded). The case's options change it: Tq queries (B,
// Tq, H, hd), G kv heads (B, T, G, hd), the causal pattern as a dense bool or additive (Tq, T)
// mask, no causal mask, a window.
// The case's score modifiers: ALiBi's slopes (the paper's geometric ones,
// 2^(-8(h+1)/H)) and a softcap.
void set_score_mods(const BenchCase& c, SdpaOptions& options) {
  if (c.alibi) {
    std::vector<float> slopes(size_t(c.heads));
    for (int64_t h = 0; h < c.heads; ++h)
      slopes[size_t(h)] = std::exp2(-8.0f * float(h + 1) / float(c.heads));
    options.alibi_slopes = Tensor({c.heads}, slopes);
  }
  options.softcap = c.softcap;
}

// The row label of the case's band and score modifiers: " w{W}" (the sliding
// window's size), " alibi", " cap{softcap}".
std::string score_mods_label(const BenchCase& c) {
  std::string label;
  if (c.window_left >= 0) label += fmt::format(" w{}", c.window_left + 1);
  if (c.alibi) label += " alibi";
  if (c.softcap > 0.0f) label += fmt::format(" cap{}", c.softcap);
  return label;
}

struct SdpaBenchProblem {
  Tensor q, k, v, dout;  // (B, H, Tq, hd), (B, G, T, hd) views
  SdpaOptions options;
  SdpaForward f;
  SdpaGrads g;
  SdpaBenchProblem(const BenchCase& c, const std::string& backend) {
    const int64_t hd = head_dim_of(c);
    const int64_t Tq = c.query_tokens > 0 ? c.query_tokens : c.T;
    const int64_t G = c.kv_heads > 0 ? c.kv_heads : c.heads;
    const DType dtype = c.dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
    auto view = [&](int64_t T, int64_t H, uint64_t seed) {
      return Tensor({c.B, T, H, hd}, normal_values(c.B * T * H * hd, seed))
          .to(dtype)
          .transpose(1, 2);
    };
    q = view(Tq, c.heads, 1), k = view(c.T, G, 2), v = view(c.T, G, 3);
    dout = view(Tq, c.heads, 4).contiguous();
    options.enable_gqa = G != c.heads;
    options.is_causal = c.causal && c.mask == "none";
    if (c.mask != "none") {  // the causal pattern, top-left: key j <= query i
      std::vector<float> m(static_cast<size_t>(Tq * c.T));
      // padded: a right-padded sequence as transformers masks it (its last T/8
      // keys closed too, the float32 minimum for a closed key): not causal.
      const float hidden = c.mask == "bool"     ? 0.0f
                           : c.mask == "padded" ? std::numeric_limits<float>::lowest()
                                                : -std::numeric_limits<float>::infinity();
      const float seen = c.mask == "bool" ? 1.0f : 0.0f;
      const int64_t keys = c.mask == "padded" ? c.T - c.T / 8 : c.T;
      for (int64_t i = 0; i < Tq; ++i)
        for (int64_t j = 0; j < c.T; ++j)
          m[static_cast<size_t>(i * c.T + j)] = j <= i && j < keys ? seen : hidden;
      options.attn_mask = Tensor({Tq, c.T}, m);
      options.attn_mask_type = c.mask == "bool" ? MaskType::kBoolean : MaskType::kAdditive;
    }
    options.window_left = c.window_left;
    set_score_mods(c, options);
    options.backend = backend == "reference" ? SdpaBackend::kReference : SdpaBackend::kFused;
  }
  void forward() { f = scaled_dot_product_attention_forward(q, k, v, options); }
  void backward() {
    g = scaled_dot_product_attention_backward(dout, q, k, v, f.out, f.lse, options);
  }
  bool finite(bool backward) const {
    return !has_non_finite(f.out) &&
           (!backward || (!has_non_finite(g.dq) && !has_non_finite(g.dk) && !has_non_finite(g.dv)));
  }
};

// sdpa_varlen_forward (attn/sdpa.h) on one packed batch of the case's
// lengths: q, k, v (total, H, hd) contiguous, cu_seqlens of the lengths, is_causal;
// float32 or bfloat16 (the values rounded).
struct SdpaVarlenBenchProblem {
  Tensor q, k, v, dout, cu_seqlens;
  int64_t max_seqlen = 0;
  SdpaOptions options;
  SdpaForward f;
  SdpaGrads g;
  SdpaVarlenBenchProblem(const BenchCase& c, const std::string& backend) {
    const int64_t hd = head_dim_of(c);
    std::vector<int64_t> offsets{0};
    for (const int64_t T : varlen_lengths(c)) {
      offsets.push_back(offsets.back() + T);
      max_seqlen = std::max(max_seqlen, T);
    }
    const int64_t total = offsets.back();
    cu_seqlens = Tensor::from_int64({int64_t(offsets.size())}, offsets);
    const DType dtype = c.dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
    auto packed = [&](uint64_t seed) {
      return Tensor({total, c.heads, hd}, normal_values(total * c.d_model, seed)).to(dtype);
    };
    q = packed(1), k = packed(2), v = packed(3), dout = packed(4);
    options.is_causal = true;
    options.window_left = c.window_left;
    set_score_mods(c, options);
    options.backend = backend == "reference" ? SdpaBackend::kReference : SdpaBackend::kFused;
  }
  void forward() {
    f = sdpa_varlen_forward(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, options);
  }
  void backward() {
    g = sdpa_varlen_backward(dout, q, k, v, f.out, f.lse, cu_seqlens, cu_seqlens, max_seqlen,
                             max_seqlen, options);
  }
  bool finite(bool backward) const {
    return !has_non_finite(f.out) &&
           (!backward || (!has_non_finite(g.dq) && !has_non_finite(g.dk) && !has_non_finite(g.dv)));
  }
};

nn::AttentionBackend parse_backend(const std::string& name) {
  if (name == "auto") return nn::AttentionBackend::kAuto;
  if (name == "reference") return nn::AttentionBackend::kReference;
  if (name == "fused") return nn::AttentionBackend::kFused;
  throw UsageError(
      fmt::format("bench: --backend must be auto, reference or fused, got '{}'", name));
}

std::unique_ptr<nn::MultiHeadAttention> make_module(const BenchCase& c,
                                                    const std::string& backend) {
  Generator gen(0);
  const DType dtype = c.dtype == "bfloat16" ? DType::kBFloat16 : DType::kFloat32;
  return std::make_unique<nn::MultiHeadAttention>(
      nn::MultiHeadAttentionOptions{.d_in = c.d_model,
                                    .d_out = c.d_model,
                                    .context_length = c.T,
                                    .dropout = 0.0f,
                                    .num_heads = c.heads,
                                    .backend = parse_backend(backend),
                                    .dtype = dtype},
      gen);
}

// ---- memory: the peak resident set while one forward+backward runs ----

// "VmHWM:   123 kB" style fields of /proc/self/status, in bytes; -1 if absent.
int64_t status_field_bytes(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field, 0) == 0) {
      std::istringstream s(line.substr(std::string(field).size()));
      int64_t kb = -1;
      s >> kb;
      return kb * 1024;
    }
  }
  return -1;
}

// Resets the peak resident set to the current one (Linux: "5" into
// /proc/self/clear_refs). Returns false where that is not possible; the peak
// is then the process's lifetime peak (getrusage), which the memory mode
// keeps meaningful by running before anything else is allocated.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

int64_t peak_rss_bytes() {
  const int64_t hwm = status_field_bytes("VmHWM:");
  if (hwm >= 0) return hwm;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return int64_t(usage.ru_maxrss) * 1024;  // KiB on Linux
}

int64_t current_rss_bytes() { return status_field_bytes("VmRSS:"); }

struct MemoryResult {
  std::string what;
  double seconds = 0;
  double extra_mb = 0;     // peak beyond inputs, outputs, gradients
  double saved_mb = 0;     // of which: what forward keeps for backward
  double baseline_mb = 0;  // resident before the run (inputs, outputs, gradients, weights)
  bool finite = false;
  bool peak_was_reset = false;
};

constexpr double kMB = 1024.0 * 1024.0;

MemoryResult memory_core(const BenchCase& c) {
  CoreProblem pr(c);  // inputs q, k, v, dout; outputs out, dq, dk, dv: allocated and written
  pr.lse.clear();
  pr.lse.shrink_to_fit();
  MemoryResult r{
      .what = fmt::format("core fwd+bwd {}x{} H={} hd={}", c.B, c.T, c.heads, head_dim_of(c))};
  r.peak_was_reset = reset_peak_rss();
  const int64_t before = r.peak_was_reset ? current_rss_bytes() : peak_rss_bytes();
  const auto t0 = Clock::now();
  pr.lse.assign(size_t(c.B * c.heads * c.T), 0.0f);  // (B, H, T): kept for backward, counted
  pr.forward();
  pr.backward();
  r.seconds = ms_since(t0) * 1e-3;
  r.extra_mb = double(peak_rss_bytes() - before) / kMB;
  r.saved_mb = double(pr.lse.size() * sizeof(float)) / kMB;
  r.baseline_mb = double(before) / kMB;
  r.finite = pr.finite(true);
  return r;
}

MemoryResult memory_module(const BenchCase& c) {
  auto m = make_module(c, "auto");  // weights and their gradients
  const Tensor x({c.B, c.T, c.d_model}, normal_values(c.B * c.T * c.d_model, 7));
  const Tensor dy({c.B, c.T, c.d_model}, normal_values(c.B * c.T * c.d_model, 8));
  MemoryResult r{.what = fmt::format("module fwd+bwd {}x{}x{} H={}", c.B, c.T, c.d_model, c.heads)};
  r.peak_was_reset = reset_peak_rss();
  const int64_t before = r.peak_was_reset ? current_rss_bytes() : peak_rss_bytes();
  const auto t0 = Clock::now();
  const Tensor y = m->forward(x);
  const Tensor dx = m->backward(dy);
  r.seconds = ms_since(t0) * 1e-3;
  // y (output) and dx (gradient) are allocated during the run: not extra.
  const double io = double((y.numel() + dx.numel()) * int64_t(sizeof(float)));
  r.extra_mb = (double(peak_rss_bytes() - before) - io) / kMB;
  // x copy, qkv (3·d), context (d), lse: what the fused forward keeps.
  const double rows = double(c.B * c.T);
  r.saved_mb = (rows * double(c.d_model) * 5.0 + double(c.B * c.heads * c.T)) * 4.0 / kMB;
  r.baseline_mb = double(before) / kMB;
  r.finite = !has_non_finite(y) && !has_non_finite(dx);
  return r;
}

// ---- printing ----

std::string shape_text(const BenchCase& c) {
  if (c.kind == "sdpa-varlen") {  // N sequences, TOTAL tokens: NsTOTALxDxH
    const std::vector<int64_t> lengths = varlen_lengths(c);
    int64_t total = 0;
    for (const int64_t T : lengths) total += T;
    return fmt::format("{}s{}x{}x{}", lengths.size(), total, c.d_model, c.heads);
  }
  return fmt::format("{}x{}x{}x{}", c.B, c.T, c.d_model, c.heads);
}

nlohmann::json to_json(const BenchResult& r, int repeats) {
  nlohmann::json j = {
      {"kind", r.c.kind},
      {"mode", r.c.mode},
      {"shape", shape_text(r.c)},
      {"B", r.c.B},
      {"T", r.c.T},
      {"d_model", r.c.d_model},
      {"heads", r.c.heads},
      {"sliding_window_size", r.c.window_left >= 0 ? nlohmann::json(r.c.window_left + 1) : nullptr},
      {"alibi", r.c.alibi},
      {"softcap", r.c.softcap},
      {"mask", r.c.mask},
      {"causal", r.c.causal},
      {"kv_heads", r.c.kv_heads > 0 ? r.c.kv_heads : r.c.heads},
      {"query_tokens", r.c.query_tokens > 0 ? r.c.query_tokens : r.c.T},
      {"head_dim", head_dim_of(r.c)},
      {"backend", r.backend},
      {"dtype", r.c.dtype},
      {"bf16_path", is_sdpa(r.c.kind) ? r.bf16_path : kernels::flash_attention_bf16_path()},
      {"ms_median", r.ms_median},
      {"ms_min", r.ms_min},
      {"flops", r.flops},
      {"gflops", r.gflops},
      {"repeats", repeats},
      {"omp_threads", omp_threads()},
      {"simd_target", kernels::flash_attention_target()}};
  if (r.c.kind == "sdpa-varlen") j["seqlens"] = varlen_lengths(r.c);
  j["pct_sgemm"] = r.pct_sgemm >= 0 ? nlohmann::json(r.pct_sgemm) : nlohmann::json(nullptr);
  j["pct_peak"] = r.pct_peak >= 0 ? nlohmann::json(r.pct_peak) : nlohmann::json(nullptr);
  return j;
}

void print_table_header() {
  fmt::print("{:<11} {:<7} {:<5} {:>15} {:>4} {:<10} {:>10} {:>9} {:>9} {:>8} {:>7}\n", "kind",
             "mode", "dtype", "B x T x d x H", "hd", "path", "ms median", "ms min", "GFLOP/s",
             "% sgemm", "% peak");
  fmt::print("{}\n", std::string(104, '-'));
}

std::string percent(double pct) { return pct >= 0 ? fmt::format("{:.1f}", pct) : "-"; }

void print_table_row(const BenchResult& r) {
  fmt::print("{:<11} {:<7} {:<5} {:>15} {:>4} {:<10} {:>10.2f} {:>9.2f} {:>9.1f} {:>8} {:>7}\n",
             r.c.kind, r.c.mode, r.c.dtype == "bfloat16" ? "bf16" : "fp32", shape_text(r.c),
             head_dim_of(r.c), r.backend, r.ms_median, r.ms_min, r.gflops, percent(r.pct_sgemm),
             percent(r.pct_peak));
  std::fflush(stdout);
}

constexpr const char* kFooter =
    "Useful causal FLOPs: core forward 4*B*H*T^2*hd/2, core backward 2.5x forward;\n"
    "projections 2*B*T*d_in*d_out per linear (q, k, v, out_proj), x3 for forward+backward.\n"
    "GFLOP/s = FLOPs / median; % sgemm = GFLOP/s / the sgemm rate measured above;\n"
    "% peak = GFLOP/s / the fp32 FMA peak measured above (the ceiling of any fp32 code);\n"
    "for bf16 rows on the AVX512-BF16 path, / the bf16 dot-product peak instead (AMX path: the\n"
    "AMX bf16 peak). Above 100% the probe is wrong, and the run says so.\n"
    "The peaks: independent chains per thread, their count swept (8..24 on AVX-512, 8..14 on\n"
    "AVX2), after a 200 ms warm-up, median of 5 runs; FLOP/cycle/core = peak / (threads x the\n"
    "clock of a dependent integer-add chain), checked against the vector width (fp32 FMA:\n"
    "2 x lanes x 1 or 2 units); an implausible figure is a warning.\n";

constexpr const char* kForcingHelp =
    "Forcing a path (read once at start; an unknown name is an error listing the valid ones):\n"
    "  ATTN_SIMD_TARGET=NAME   the kernels' SIMD target (--target), e.g. AVX2 or SSE4\n"
    "  ATTN_BF16_PATH=NAME     the bf16 attention path (--bf16-path), e.g. 'widened to fp32'\n"
    "  ATTN_GEMV_BF16_PATH=NAME\n"
    "                          the bf16 decode GEMV's path (attn generate): AVX512-BF16 or widened\n"
    "  ATTN_GEMM_ENGINE=NAME   the fast gemm engine: onednn, blas or auto (oneDNN where it is\n"
    "                          built in: the same engine every run; docs/gemm.md)\n"
    "  ATTN_BF16_GEMM=NAME     the bf16 products' route: matmul (oneDNN's bf16 matmul), widened\n"
    "                          (bf16 widened to fp32, then sgemm) or auto (matmul on AMX or AMD's\n"
    "                          AVX512-BF16, else widened; docs/gemm.md)\n";

}  // namespace

BenchCase parse_bench_shape(const std::string& text) {
  BenchCase c;
  char x1 = 0, x2 = 0, x3 = 0;
  std::istringstream s(text);
  if (!(s >> c.B >> x1 >> c.T >> x2 >> c.d_model >> x3 >> c.heads) || x1 != 'x' || x2 != 'x' ||
      x3 != 'x' || !s.eof()) {
    throw UsageError(fmt::format("bench: a shape is BxTxDxH, e.g. 1x1024x768x12; got '{}'", text));
  }
  c.kind = "core", c.mode = "fwd";
  check_case(c);
  return c;
}

BenchResult run_bench_case(const BenchCase& c, int repeats, const std::string& backend) {
  check_case(c);
  if (repeats < 1) throw UsageError(fmt::format("bench: --repeats must be >= 1, got {}", repeats));
  const bool backward = c.mode == "fwdbwd";
  BenchResult r{.c = c, .backend = "fused", .bf16_path = ""};
  // Warm-up: the first repeat (its outputs checked), then more until
  // kWarmUpMs have passed. Right after start-up OpenBLAS's idle threads spin
  // for a while and take a core from the kernel's threads, so a short case
  // timed at once on a 2-core machine runs at half speed.
  constexpr double kWarmUpMs = 250.0;
  std::vector<double> ms;
  auto time_repeats = [&](auto&& repeat) {
    const auto warm_up = Clock::now();
    for (int rep = 0; rep == 0 || ms_since(warm_up) < kWarmUpMs; ++rep) repeat(rep == 0);
    for (int rep = 0; rep < repeats; ++rep) {
      const auto t0 = Clock::now();
      repeat(false);
      ms.push_back(ms_since(t0));
    }
  };
  if (c.kind == "sdpa") {
    SdpaBenchProblem pr(c, backend);
    time_repeats([&](bool check) {
      pr.forward();
      if (backward) pr.backward();
      if (check && !pr.finite(backward))
        throw std::runtime_error("bench: scaled_dot_product_attention gave a non-finite result");
    });
    r.backend = backend == "reference" ? "reference" : "fused";
    r.bf16_path = c.dtype == "bfloat16" ? kernels::sdpa_bf16_path(pr.q, pr.k, pr.v, pr.options)
                                        : kernels::sdpa_bf16_path();
    // bf16: the path that ran (the row's dtype column says bf16)
    if (c.dtype == "bfloat16" && backend != "reference")
      r.backend += r.bf16_path == "AMX"           ? "-amx"
                   : r.bf16_path == "AVX512-BF16" ? "-bf16dot"
                                                  : "-wide";
    r.backend += score_mods_label(c);
    if (c.mask != "none") r.backend += " " + c.mask + "-mask";
    if (!c.causal && c.mask == "none") r.backend += " full";
    if (c.kv_heads > 0 && c.kv_heads != c.heads) r.backend += fmt::format(" gqa{}", c.kv_heads);
    if (c.query_tokens > 0) r.backend += fmt::format(" tq{}", c.query_tokens);
  } else if (c.kind == "sdpa-varlen") {
    SdpaVarlenBenchProblem pr(c, backend);
    time_repeats([&](bool check) {
      pr.forward();
      if (backward) pr.backward();
      if (check && !pr.finite(backward))
        throw std::runtime_error("bench: sdpa_varlen gave a non-finite result");
    });
    r.backend = backend == "reference" ? "reference" : "fused";
    // sdpa_varlen_* never take the AMX kernel: the sdpa kernel's engine
    r.bf16_path = c.dtype != "bfloat16"               ? kernels::sdpa_bf16_path()
                  : kernels::bf16_dot_engine_chosen() ? "AVX512-BF16"
                                                      : "bf16 tiles widened to fp32";
    if (c.dtype == "bfloat16" && backend != "reference")
      r.backend += r.bf16_path == "AVX512-BF16" ? "-bf16dot" : "-wide";
    r.backend += score_mods_label(c);
  } else if (c.kind == "core") {
    CoreProblem pr(c);
    time_repeats([&](bool check) {
      pr.forward();
      if (backward) pr.backward();
      const bool ok = !check || pr.finite(backward);
      if (!ok) throw std::runtime_error("bench: the core gave a non-finite result");
    });
  } else {
    auto m = make_module(c, backend);
    const Tensor x({c.B, c.T, c.d_model}, normal_values(c.B * c.T * c.d_model, 7));
    const Tensor dy({c.B, c.T, c.d_model}, normal_values(c.B * c.T * c.d_model, 8));
    time_repeats([&](bool check) {
      const Tensor y = m->forward(x);
      const Tensor dx = backward ? m->backward(dy) : Tensor();
      if (check && (has_non_finite(y) || has_non_finite(dx)))
        throw std::runtime_error("bench: the module gave a non-finite result");
    });
    r.backend = nn::to_string(m->last_backend());
  }
  r.ms_median = median(ms);
  r.ms_min = *std::min_element(ms.begin(), ms.end());
  r.flops = case_flops(c);
  r.gflops = r.flops / (r.ms_median * 1e-3) * 1e-9;
  return r;
}

Command add_bench_command(CLI::App& app) {
  struct Flags {
    std::vector<std::string> shapes;
    std::string kind = "all", mode = "all", backend = "auto", dtype = "float32";
    // Defaults; each applies only when its option is not given (an explicit 0 is an error).
    int64_t batch = 1, tokens = 1024, d_model = 768, heads = 12;
    int repeats = 5, threads = 0, sgemm_n = 4096;  // --quick: 3 repeats, sgemm of 2048
    bool quick = false, json = false, memory = false, sgemm = false, bandwidth = false;
    bool no_probe = false;  // skip the peak probes (about 5 s)
    int64_t memory_tokens = 16384;
    int64_t sliding_window_size = 0;  // the book's W (0: none); the kernels' window_left = W - 1
    bool alibi = false;
    float softcap = 0.0f;
    int64_t bandwidth_mib = 256;
    std::string mask = "none";
    bool no_causal = false;
    int64_t kv_heads = 0, query_tokens = 0;                   // kv_heads 0: --heads
    std::vector<std::string> caches = {"4k", "32k", "128k"};  // --kind decode
    int64_t head_dim = 64, queries = 1;                       // --kind decode
    std::vector<int64_t> seqlens;
    std::string simd_target, bf16_path;  // empty: the automatic choice (or the environment's)
  };
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "bench",
      "Time the fused attention core and the MultiHeadAttention module (forward, "
      "forward+backward) beside this machine's sgemm rate");
  cmd->footer(std::string(kFooter) + kForcingHelp +
              "Examples:\n  attn bench                      the table of docs/performance.md\n"
              "  attn bench --memory             T=16384: time and peak memory\n"
              "  attn bench --json --kind module --batch 1 --tokens 1024 --d-model 768 "
              "--heads 12 --mode fwdbwd --repeats 5");
  add_option(cmd, "--shapes", f->shapes,
             "Shapes BxTxDxH (comma-separated); default: " +
                 fmt::format("{}", fmt::join(kDefaultShapes, ",")))
      ->delimiter(',')
      ->type_name("LIST");
  add_option(cmd, "--kind", f->kind,
             "core, module, sdpa, sdpa-varlen or all (all: core and module; sdpa: "
             "scaled_dot_product_attention on the core's problem; sdpa-varlen: "
             "sdpa_varlen_forward on one packed batch of --seqlens, shape column "
             "NsTOTALxDxH), or a comma-separated list (core,sdpa: the two side by side); "
             "or decode alone: one decoding step's attention over KV caches of --cache "
             "lengths (flash-decoding, attn/decode_attention.h), GB/s of keys and values "
             "read and their share of the read bandwidth measured in the run")
      ->capture_default_str();
  add_option(cmd, "--mode", f->mode, "fwd, fwdbwd or all")->capture_default_str();
  add_option(cmd, "--dtype", f->dtype,
             "float32 (or fp32), bfloat16 (or bf16) or all: the core's inputs and outputs "
             "(bfloat16: the bf16 kernels, path AMX, AVX512-BF16 or widened to fp32); sdpa's "
             "and sdpa-varlen's q, k, v, dout (bfloat16: rows the AMX kernel takes (the "
             "core's problem, with or without a mask) where the bf16 path is AMX, rows "
             "'fused-amx'; the others the sdpa kernel on VDPBF16PS where that is the path's "
             "engine, rows 'fused-bf16dot', else bf16 tiles widened to fp32, rows "
             "'fused-wide'); the "
             "module's compute dtype (bfloat16: mixed precision, fp32 "
             "weights)")
      ->capture_default_str();
  add_option(cmd, "--backend", f->backend,
             "The module's (and sdpa's) path: auto, reference or fused")
      ->capture_default_str();
  add_option(cmd, "--batch", f->batch, "One shape: B (default 1)")->type_name("B");
  add_option(cmd, "--tokens", f->tokens, "One shape: T (default 1024)")->type_name("T");
  add_option(cmd, "--d-model", f->d_model, "One shape: d_in = d_out (default 768)")->type_name("D");
  add_option(cmd, "--heads", f->heads, "One shape: H (default 12)")->type_name("H");
  add_option(cmd, "--repeats", f->repeats,
             "Timed repeats per case after the warm-up (at least one repeat and 250 ms; "
             "default 5, --quick 3)");
  add_option(cmd, "-t,--threads", f->threads,
             "OpenMP and BLAS threads (default: OpenMP's default, OMP_NUM_THREADS)");
  cmd->add_flag("--quick", f->quick, "Fewer shapes and repeats, sgemm of 2048^3");
  add_option(cmd, "--target", f->simd_target,
             "Run the kernels (and the fp32 FMA peak probe) on this SIMD target, one of "
             "those the header lists, e.g. AVX2 on an AVX-512 CPU (as ATTN_SIMD_TARGET)")
      ->type_name("NAME");
  add_option(cmd, "--bf16-path", f->bf16_path,
             "Run the bf16 attention kernels on this path, one of those the header lists, "
             "e.g. 'widened to fp32' (as ATTN_BF16_PATH)")
      ->type_name("NAME");
  cmd->add_flag("--json", f->json,
                "Print a JSON array of the results (ms_median, ms_min, gflops, ...) instead of "
                "the table; skips the sgemm and peak measurements unless --sgemm is given");
  cmd->add_flag("--sgemm", f->sgemm,
                "With --json: measure sgemm and the FMA peak too (pct_sgemm, pct_peak)");
  add_option(cmd, "--sgemm-n", f->sgemm_n, "Size n of the sgemm n^3 (default 4096, --quick 2048)");
  cmd->add_flag("--no-probe", f->no_probe,
                "Skip the three peak probes (fp32 FMA, bf16 dot product, AMX; about 5 s): the "
                "header says the peaks were not measured, % peak is '-' (--json: pct_peak null, "
                "machine.peaks_measured false and its peaks null); sgemm still runs");
  cmd->add_flag("--memory", f->memory,
                "Memory mode: one forward+backward of the core and of the module at B=1, "
                "T=--memory-tokens, 12 heads of 64; peak memory beyond inputs, outputs and "
                "gradients");
  add_option(cmd, "--memory-tokens", f->memory_tokens, "T for --memory")->capture_default_str();
  add_option(cmd, "--sliding-window-size", f->sliding_window_size,
             "sdpa, sdpa-varlen and decode rows: a causal sliding window of W keys, each "
             "query seeing itself and the W - 1 before it (the book's ch04/06_swa; "
             "window_left = W - 1 in attn/sdpa.h)")
      ->type_name("W");
  cmd->add_flag("--alibi", f->alibi,
                "sdpa and sdpa-varlen rows: ALiBi on the scores, slope 2^(-8(h+1)/H) for head h");
  add_option(cmd, "--softcap", f->softcap,
             "sdpa and sdpa-varlen rows: a softcap on the scores, softcap · tanh(s / softcap) "
             "(> 0; Gemma 2 uses 50)")
      ->type_name("CAP");
  add_option(cmd, "--mask", f->mask,
             "sdpa rows: bool or float, the causal pattern as a dense (Tq, T) attn_mask "
             "instead of is_causal (attn runs it as is_causal); padded, the causal pattern "
             "with the last T/8 keys closed too, float32 minimum where closed (a "
             "right-padded sequence as transformers masks it; the masked kernels)")
      ->type_name("KIND");
  cmd->add_flag("--no-causal", f->no_causal, "sdpa rows: attend to every key (cross-attention)");
  add_option(cmd, "--kv-heads", f->kv_heads,
             "sdpa rows and --kind decode: grouped-query attention, this many key/value "
             "heads (dividing H)")
      ->type_name("G");
  add_option(cmd, "--query-tokens", f->query_tokens,
             "sdpa rows: this many queries against the T keys (default T)")
      ->type_name("TQ");
  add_option(cmd, "--seqlens", f->seqlens,
             "sdpa-varlen rows: the lengths of the packed sequences, comma-separated, "
             "e.g. 512,1024,256,2048 (default: each shape's B sequences of T tokens)")
      ->delimiter(',')
      ->type_name("LIST");
  cmd->add_flag("--bandwidth", f->bandwidth,
                "Memory read bandwidth instead (GB/s; what bounds decoding one token at a "
                "time): every thread sums its part of a --bandwidth-mib buffer, median of "
                "--repeats passes, with 1 thread and with the OpenMP thread count; --json: "
                "one object");
  add_option(cmd, "--bandwidth-mib", f->bandwidth_mib, "Buffer for --bandwidth, MiB (>= 1)")
      ->capture_default_str();
  add_option(cmd, "--cache", f->caches,
             "--kind decode: KV cache lengths, comma-separated, 4096 or 4k (default "
             "4k,32k,128k); with --heads (default 12), --kv-heads, --head-dim, --queries, "
             "--batch, --sliding-window-size, --dtype, --threads, --repeats (default 20), "
             "--bandwidth-mib (the probe's buffer, default twice the last-level cache and "
             "256 MiB at least; the steps cycle through copies of the caches spanning as "
             "much)")
      ->delimiter(',')
      ->type_name("LIST");
  add_option(cmd, "--head-dim", f->head_dim, "--kind decode: head dim D")->capture_default_str();
  add_option(cmd, "--queries", f->queries,
             "--kind decode: new queries per step, 1..16 (bottom-right causal)")
      ->capture_default_str();

  // A count given as 0 (or less) is a usage error, not a request for the default; each
  // has an upper bound, checked as it is parsed, before anything is allocated (issue 46).
  // (--queries: --kind decode's own check, 1..16.)
  for (const auto& [option, max] :
       {std::pair{"--batch", kMaxBenchBatch}, std::pair{"--tokens", kMaxBenchTokens},
        std::pair{"--d-model", kMaxBenchWidth}, std::pair{"--heads", kMaxBenchHeads},
        std::pair{"--repeats", int64_t{1000000}}, std::pair{"--threads", int64_t{4096}},
        std::pair{"--sgemm-n", int64_t{32768}}, std::pair{"--memory-tokens", kMaxBenchTokens},
        std::pair{"--kv-heads", kMaxBenchHeads}, std::pair{"--query-tokens", kMaxBenchTokens},
        std::pair{"--head-dim", kMaxBenchWidth}, std::pair{"--bandwidth-mib", int64_t{65536}},
        std::pair{"--sliding-window-size", kMaxBenchTokens},
        std::pair{"--seqlens", kMaxBenchTokens}})
    in_range(cmd->get_option(option), int64_t{1}, max);

  auto run = [f, cmd]() -> int {
    const auto given = [cmd](const char* option) { return cmd->count(option) > 0; };
    // The one conversion from the CLI's spelling to the kernels' (-1: no window).
    const int64_t window_left = f->sliding_window_size - 1;
    if (given("--softcap") && !(f->softcap > 0.0f && std::isfinite(f->softcap)))
      throw UsageError(
          fmt::format("bench: --softcap must be a finite number > 0, got {}", f->softcap));
    check_mask(f->mask);
    // Every shape's heads, before anything is printed (--kind decode checks
    // its --heads and --kv-heads itself).
    if (given("--kv-heads") && f->kind != "decode") {
      const bool one_shape =
          given("--batch") || given("--tokens") || given("--d-model") || given("--heads");
      std::vector<int64_t> heads = {f->heads};
      if (!one_shape) {
        heads.clear();
        for (const auto& s :
             f->shapes.empty() ? (f->quick ? kQuickShapes : kDefaultShapes) : f->shapes)
          heads.push_back(parse_bench_shape(s).heads);
      }
      for (const int64_t h : heads)
        if (h % f->kv_heads != 0)
          throw UsageError(
              fmt::format("bench: --kv-heads must divide --heads {}, got {}", h, f->kv_heads));
    }
    // --kind: one of core, module, sdpa, all, or a comma-separated list (core,sdpa: side by side).
    std::vector<std::string> kinds;
    for (size_t at = 0; at <= f->kind.size();) {
      const size_t comma = std::min(f->kind.find(',', at), f->kind.size());
      const std::string kind = f->kind.substr(at, comma - at);
      if (kind != "all" && kind != "core" && kind != "module" && !is_sdpa(kind) && kind != "decode")
        throw UsageError(fmt::format(
            "bench: --kind must be core, module, sdpa, sdpa-varlen or all, got '{}' (or decode, "
            "alone)",
            printable(f->kind)));
      if (kind == "all")
        kinds.insert(kinds.end(), {"core", "module"});
      else
        kinds.push_back(kind);
      at = comma + 1;
    }
    const bool decode = std::find(kinds.begin(), kinds.end(), "decode") != kinds.end();
    if (decode && kinds.size() != 1)
      throw UsageError(
          fmt::format("bench: --kind decode runs alone, got '{}'", printable(f->kind)));
    if (given("--seqlens")) {
      if (std::find(kinds.begin(), kinds.end(), "sdpa-varlen") == kinds.end())
        throw UsageError("bench: --seqlens applies to --kind sdpa-varlen only");
    }
    if (f->mode != "all" && f->mode != "fwd" && f->mode != "fwdbwd")
      throw UsageError(fmt::format("bench: --mode must be fwd, fwdbwd or all, got '{}'", f->mode));
    if (f->dtype == "fp32") f->dtype = "float32";  // the table's short names
    if (f->dtype == "bf16") f->dtype = "bfloat16";
    if (f->dtype != "all" && f->dtype != "float32" && f->dtype != "bfloat16")
      throw UsageError(fmt::format("bench: --dtype must be float32, bfloat16 or all, got '{}'",
                                   printable(f->dtype)));
    std::vector<std::string> dtypes = {"float32", "bfloat16"};
    if (f->dtype != "all") dtypes = {f->dtype};
    parse_backend(f->backend);
    if (given("--threads")) set_threads(f->threads);
    const int repeats = given("--repeats") ? f->repeats : (f->quick ? 3 : 5);
    if (given("--target") && !kernels::flash_attention_use_target(f->simd_target.c_str()))
      throw UsageError(fmt::format("bench: --target must be one of {}, got '{}'",
                                   fmt::join(kernels::flash_attention_targets(), ", "),
                                   printable(f->simd_target)));
    if (given("--bf16-path") && !kernels::flash_attention_bf16_use_path(f->bf16_path.c_str()))
      throw UsageError(fmt::format("bench: --bf16-path must be one of '{}', got '{}'",
                                   fmt::join(kernels::flash_attention_bf16_paths(), "', '"),
                                   printable(f->bf16_path)));
    const std::string target = kernels::flash_attention_target();

    if (decode) {
      DecodeBenchOptions o;
      for (const std::string& c : f->caches) o.caches.push_back(parse_cache_length(c));
      o.dtypes = dtypes;
      o.batch = f->batch, o.heads = f->heads, o.head_dim = f->head_dim, o.queries = f->queries;
      o.kv_heads = given("--kv-heads") ? f->kv_heads : f->heads;
      o.window_left = window_left;
      o.repeats = given("--repeats") ? f->repeats : 20;
      o.json = f->json;
      o.bandwidth_mib = given("--bandwidth-mib") ? f->bandwidth_mib : 0;
      return run_decode_bench(o);
    }

    if (f->bandwidth) {
      if (f->bandwidth_mib < 1)
        throw UsageError(
            fmt::format("bench: --bandwidth-mib must be >= 1, got {}", f->bandwidth_mib));
      const int64_t bytes = f->bandwidth_mib << 20;
      const int n = omp_threads();
      std::vector<std::pair<int, double>> rates;
      for (int t : n > 1 ? std::vector<int>{1, n} : std::vector<int>{1})
        rates.emplace_back(t, kernels::read_bandwidth_gbs(bytes, t, repeats));
      if (f->json) {
        nlohmann::json j = {{"cpu", cpu_name()}, {"bytes", bytes}, {"repeats", repeats}};
        for (const auto& [t, gbs] : rates) j["read_gbs"][std::to_string(t)] = gbs;
        fmt::print("{}\n", j.dump());
      } else {
        fmt::print("attn bench --bandwidth: {}, {} CPUs, SIMD target {}, buffer {} MiB\n",
                   cpu_name(), std::thread::hardware_concurrency(), target, f->bandwidth_mib);
        for (const auto& [t, gbs] : rates)
          fmt::print("read bandwidth, {} thread{}: {:.1f} GB/s (median of {})\n", t,
                     t == 1 ? "" : "s", gbs, repeats);
      }
      return 0;
    }

    if (f->memory) {
      BenchCase c{.kind = "core", .mode = "fwdbwd", .B = 1, .T = f->memory_tokens, .heads = 12};
      c.dtype = f->dtype == "bfloat16" ? "bfloat16" : "float32";
      check_case(c);
      fmt::print(
          "attn bench --memory: {}, {} CPUs, SIMD target {}, {} OpenMP threads, core in {}{}\n",
          cpu_name(), std::thread::hardware_concurrency(), target, omp_threads(), c.dtype,
          c.dtype == "bfloat16" ? fmt::format(" ({})", kernels::flash_attention_bf16_path())
                                : std::string());
      fmt::print("{:<36} {:>8} {:>12} {:>14} {:>10} {:>7}\n", "what", "seconds", "extra MB",
                 "of which saved", "base MB", "finite");
      bool ok = true;
      for (const auto& r : {memory_core(c), memory_module(c)}) {
        fmt::print("{:<36} {:>8.2f} {:>12.1f} {:>14.1f} {:>10.1f} {:>7}\n", r.what, r.seconds,
                   r.extra_mb, r.saved_mb, r.baseline_mb, r.finite ? "yes" : "NO");
        ok = ok && r.finite;
        if (!r.peak_was_reset)
          fmt::print("  (peak from getrusage: /proc/self/clear_refs failed)\n");
        if (r.what.rfind("core", 0) == 0) {
          fmt::print("  core target: extra < 64 MB: {}\n", r.extra_mb < 64.0 ? "met" : "NOT met");
          ok = ok && r.extra_mb < 64.0;
        }
      }
      fmt::print(
          "extra = peak resident set during the run - resident set before it (inputs, outputs,\n"
          "gradients, weights, the module's mask buffer), minus the module's output and dx.\n"
          "'saved' is what forward keeps for backward (core: lse; module: x, qkv, context, "
          "lse).\n");
      return ok ? 0 : 1;
    }

    std::vector<BenchCase> shapes;
    if (given("--batch") || given("--tokens") || given("--d-model") || given("--heads")) {
      BenchCase c{.B = f->batch, .T = f->tokens, .d_model = f->d_model, .heads = f->heads};
      c.kind = "core", c.mode = "fwd";
      check_case(c);
      shapes.push_back(c);
    } else {
      for (const auto& s :
           f->shapes.empty() ? (f->quick ? kQuickShapes : kDefaultShapes) : f->shapes)
        shapes.push_back(parse_bench_shape(s));
    }
    std::vector<std::string> modes = {"fwd", "fwdbwd"};
    if (f->mode != "all") modes = {f->mode};

    double sgemm = -1, peak = -1, bf16_peak = -1;
    SgemmYardstick yardstick{.n = given("--sgemm-n") ? f->sgemm_n : (f->quick ? 2048 : 4096),
                             .runs = f->quick ? 3 : 5};
    const bool measure = !f->json || f->sgemm;
    const bool probe_peaks = measure && !f->no_probe;
    Machine machine;
    if (measure) {
      machine = machine_facts(probe_peaks);
      peak = machine.fma.gflops;
      if (machine.bf16.gflops > 0) bf16_peak = machine.bf16.gflops;
      yardstick.blas = attn::bench::sgemm_gflops(yardstick.n, yardstick.runs, gemm::Engine::kBlas);
      yardstick.fast = attn::bench::sgemm_gflops(yardstick.n, yardstick.runs, gemm::Engine::kFast);
      // The yardstick: the best product this build has.
      sgemm = std::max(yardstick.blas, yardstick.fast);
      // OpenBLAS's threads spin for a while after a call; let them go idle so
      // they do not slow the first case down.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    } else {
      machine = machine_facts(false);
    }
    if (!f->json) {
      print_machine_header(machine, probe_peaks, yardstick, repeats);
      fmt::print("\n");
      print_table_header();
    }
    int64_t above_peak = 0;  // rows faster than the measured peak
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& shape : shapes) {
      for (const auto& kind : kinds) {
        for (const auto& mode : modes) {
          for (const auto& dtype : dtypes) {
            BenchCase c = shape;
            c.kind = kind, c.mode = mode, c.dtype = dtype;
            if (is_sdpa(kind)) {
              c.window_left = window_left;
              c.alibi = f->alibi, c.softcap = f->softcap;
            }
            if (kind == "sdpa") {
              c.mask = f->mask, c.causal = !f->no_causal;
              c.kv_heads = f->kv_heads, c.query_tokens = f->query_tokens;
            }
            if (kind == "sdpa-varlen") c.seqlens = f->seqlens;
            BenchResult r = run_bench_case(c, repeats, f->backend);
            const std::string bf16_path = kernels::flash_attention_bf16_path();
            const bool bf16_rows = dtype == "bfloat16" && !is_sdpa(kind);
            double ceiling = peak;
            if (bf16_rows && bf16_path == "AVX512-BF16") ceiling = bf16_peak;
            if (bf16_rows && bf16_path == "AMX" && machine.amx.gflops > 0)
              ceiling = machine.amx.gflops;
            if (is_sdpa(kind) && dtype == "bfloat16" && r.bf16_path == "AMX" &&
                machine.amx.gflops > 0)
              ceiling = machine.amx.gflops;
            if (is_sdpa(kind) && dtype == "bfloat16" && r.bf16_path == "AVX512-BF16")
              ceiling = bf16_peak;
            if (sgemm > 0) r.pct_sgemm = 100.0 * r.gflops / sgemm;
            if (ceiling > 0) r.pct_peak = 100.0 * r.gflops / ceiling;
            if (r.pct_peak > 100.0) ++above_peak;
            if (f->json) {
              rows.push_back(to_json(r, repeats));
              rows.back()["machine"] = machine_json(machine, probe_peaks);
            } else {
              print_table_row(r);
            }
          }
        }
      }
    }
    if (f->json) {
      std::cout << rows.dump(1) << std::endl;
    } else {
      fmt::print("\n{}", kFooter);
    }
    if (above_peak > 0) {
      fmt::print(stderr,
                 "warning: {} case(s) ran above 100% of the measured peak: the probe is wrong "
                 "(it under-reads this CPU; a bug in the probe, not a faster kernel)\n",
                 above_peak);
    }
    return 0;
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
