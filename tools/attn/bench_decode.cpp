// bench_decode.cpp - `attn bench --kind decode` (bench_decode.h): one decoding
// step's attention (kernels::decode_attention_forward[_bf16],
// attn/decode_attention.h) over KV caches of given lengths, with the bytes of
// keys and values it reads per step, their rate in GB/s, and that rate as a
// share of the machine's read bandwidth measured in the same run with the same
// threads.
#include "bench_decode.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn/decode_attention.h"
#include "attn/decode_kernels.h"
#include "attn/kernels.h"
#include "attn/tensor.h"
#include "attn/utf8.h"
#include "bench_machine.h"
#include "command.h"

namespace attn::cli {
namespace {

using Clock = std::chrono::steady_clock;

// The caches of one case, and enough copies of them that one pass over all
// is >= footprint bytes (the bandwidth probe's buffer: by default twice the
// last-level cache, 256 MiB at least): the timed steps read the copies in
// turn, so each step's keys and values come from memory, as a model's
// layers' caches do (a single 4k cache would otherwise stay in the
// last-level cache, 480 MiB on some Xeons).

// Values in [-1, 1) from a hash of the index: cheap to fill hundreds of MB.
float hashed_value(uint64_t i) {
  i = (i + 0x9E3779B97F4A7C15ull) * 0xBF58476D1CE4E5B9ull;
  i ^= i >> 31;
  return float(int64_t(i >> 40) - (int64_t{1} << 23)) * 0x1p-23f;
}

template <class T>
T convert(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return to_bfloat16(x);
  }
}

// n values in attn's own storage, as a model's KV cache is held (2 MiB-aligned,
// transparent huge pages where the kernel grants them: src/tensor/storage_cache.cpp,
// as kernels::read_bandwidth_gbs's buffer).
template <class T>
Tensor filled(int64_t n, uint64_t seed) {
  Tensor t = Tensor::empty({n}, dtype_of<T>());
  T* p = t.data_ptr<T>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) p[i] = convert<T>(hashed_value(uint64_t(i) + seed));
  return t;
}

// The last-level cache's size (0 if unknown).
int64_t last_level_cache_bytes() {
  for (int level = 4; level >= 2; --level) {
    std::ifstream in(fmt::format("/sys/devices/system/cpu/cpu0/cache/index{}/size", level));
    int64_t kb = 0;
    char unit = 0;
    if (in >> kb >> unit) return kb << (unit == 'M' ? 20 : 10);
  }
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <class T>
DecodeBenchResult run_case(const DecodeProblem& p, int repeats, int64_t footprint) {
  const int64_t element = int64_t(sizeof(T));
  const int64_t kv_elems = p.B * p.Hkv * p.capacity * p.D;
  const int64_t copies =
      std::max<int64_t>(1, (footprint + 2 * kv_elems * element - 1) / (2 * kv_elems * element));
  std::vector<Tensor> keys, values;
  for (int64_t c = 0; c < copies; ++c) {
    keys.push_back(filled<T>(kv_elems, uint64_t(2 * c) << 40));
    values.push_back(filled<T>(kv_elems, uint64_t(2 * c + 1) << 40));
  }
  const int64_t q_elems = p.B * p.Tq * p.Hq * p.D;
  const Tensor q = filled<T>(q_elems, uint64_t(1) << 60);
  Tensor out = Tensor::empty({q_elems}, dtype_of<T>());
  const auto step = [&](int64_t c) {
    if constexpr (std::is_same_v<T, float>) {
      kernels::decode_attention_forward(out.data(), q.data(), keys[size_t(c)].data(),
                                        values[size_t(c)].data(), p);
    } else {
      kernels::decode_attention_forward_bf16(out.data_ptr<BFloat16>(), q.data_ptr<BFloat16>(),
                                             keys[size_t(c)].data_ptr<BFloat16>(),
                                             values[size_t(c)].data_ptr<BFloat16>(), p);
    }
  };
  // Warm-up: every copy once (pages touched, threads started), then steps
  // for at least 250 ms; the outputs checked finite.
  // The timed steps go on through the copies in the same cyclic order, so
  // between two reads of a copy all the others are read (>= footprint bytes).
  const auto warm = Clock::now();
  int64_t next = 0;
  for (; next < copies || Clock::now() - warm < std::chrono::milliseconds(250); ++next)
    step(next % copies);
  for (int64_t i = 0; i < q_elems; ++i) {
    float x;
    if constexpr (std::is_same_v<T, float>) {
      x = out.data()[i];
    } else {
      x = to_float(out.data_ptr<BFloat16>()[i]);
    }
    if (!std::isfinite(x))
      throw std::runtime_error("bench: decode attention gave a non-finite output");
  }
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    step(next++ % copies);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  DecodeBenchResult res;
  res.ms_median = median(ms);
  res.ms_min = *std::min_element(ms.begin(), ms.end());
  res.kv_bytes = kernels::decode_attention_kv_bytes(p, element);
  res.gbs = double(res.kv_bytes) / (res.ms_median * 1e-3) * 1e-9;
  res.copies = copies;
  return res;
}

}  // namespace

DecodeBenchResult run_decode_case(const DecodeProblem& p, bool bf16, int repeats,
                                  int64_t footprint) {
  if (repeats < 1) throw UsageError(fmt::format("bench: --repeats must be >= 1, got {}", repeats));
  return bf16 ? run_case<BFloat16>(validated(p), repeats, footprint)
              : run_case<float>(validated(p), repeats, footprint);
}

int64_t parse_cache_length(const std::string& text) {
  int64_t unit = 1;
  std::string digits = text;
  if (!digits.empty() && (digits.back() == 'k' || digits.back() == 'K')) {
    unit = 1024;
    digits.pop_back();
  }
  const bool ok =
      !digits.empty() && digits.size() <= 9 &&
      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int64_t n = ok ? std::stoll(digits) * unit : 0;
  if (n < 1)
    throw UsageError(fmt::format("bench: --cache takes lengths like 4096 or 4k (>= 1), got '{}'",
                                 printable(text)));
  return n;
}

int run_decode_bench(const DecodeBenchOptions& o) {
  const int threads =
#ifdef _OPENMP
      omp_get_max_threads();
#else
      1;
#endif
  if (o.heads < 1 || o.kv_heads < 1 || o.heads % o.kv_heads != 0 || o.head_dim < 1 ||
      o.queries < 1 || o.queries > kMaxDecodeQueries || o.batch < 1) {
    throw UsageError(fmt::format(
        "bench: --kind decode needs --heads a multiple of --kv-heads, --head-dim >= 1, --batch "
        ">= 1 and --queries in 1..{}; got heads {}, kv-heads {}, head-dim {}, batch {}, queries {}",
        kMaxDecodeQueries, o.heads, o.kv_heads, o.head_dim, o.batch, o.queries));
  }
  for (int64_t n : o.caches) {
    if (n < o.queries)
      throw UsageError(fmt::format("bench: --cache {} is shorter than --queries {}", n, o.queries));
  }
  if (o.bandwidth_mib < 0)
    throw UsageError(fmt::format("bench: --bandwidth-mib must be >= 1, got {}", o.bandwidth_mib));
  const int64_t l3 = last_level_cache_bytes();
  const int64_t probe_mib = o.bandwidth_mib > 0
                                ? o.bandwidth_mib
                                : std::max<int64_t>(256, (2 * l3 + (1 << 20) - 1) >> 20);
  const int64_t probe = probe_mib << 20;
  nlohmann::json rows = nlohmann::json::array();
  if (!o.json) {
    fmt::print(
        "attn bench --kind decode: {}, {} CPUs, SIMD target {}, {} OpenMP thread{}, chunks of {} "
        "keys, last-level cache {} MiB\nread bandwidth (bw): kernels::read_bandwidth_gbs over {} "
        "MiB with the same {} thread{}, median of 5, measured right after each case\n",
        cpu_name(), std::thread::hardware_concurrency(), kernels::flash_attention_target(), threads,
        threads == 1 ? "" : "s", kDecodeChunk, l3 >> 20, probe_mib, threads,
        threads == 1 ? "" : "s");
    fmt::print(
        "{:<5} {:>3} {:>4} {:>4} {:>4} {:>3} {:>7} {:>6} {:>10} {:>9} {:>11} {:>8} {:>8} {:>7}\n",
        "dtype", "B", "Hq", "Hkv", "D", "Tq", "cache", "window", "ms/step", "ms min", "KV MB/step",
        "GB/s", "bw GB/s", "% bw");
    fmt::print("{}\n", std::string(99, '-'));
  }
  for (const std::string& dtype : o.dtypes) {
    for (int64_t cache : o.caches) {
      const DecodeProblem p{.B = o.batch,
                            .Hq = o.heads,
                            .Hkv = o.kv_heads,
                            .Tq = o.queries,
                            .length = cache,
                            .capacity = cache,
                            .D = o.head_dim,
                            .scale = 1.0f / std::sqrt(float(o.head_dim)),
                            .window_left = o.window_left};
      const DecodeBenchResult r = run_decode_case(p, dtype == "bfloat16", o.repeats, probe);
      const double bandwidth = kernels::read_bandwidth_gbs(probe, threads, 5);
      const double pct = 100.0 * r.gbs / bandwidth;
      if (o.json) {
        rows.push_back({{"kind", "decode"},
                        {"dtype", dtype},
                        {"B", p.B},
                        {"heads", p.Hq},
                        {"kv_heads", p.Hkv},
                        {"head_dim", p.D},
                        {"queries", p.Tq},
                        {"cache", cache},
                        {"sliding_window_size",
                         p.window_left >= 0 ? nlohmann::json(p.window_left + 1) : nullptr},
                        {"omp_threads", threads},
                        {"ms_median", r.ms_median},
                        {"ms_min", r.ms_min},
                        {"kv_bytes", r.kv_bytes},
                        {"gbs", r.gbs},
                        {"bandwidth_gbs", bandwidth},
                        {"pct_bandwidth", pct},
                        {"copies", r.copies},
                        {"repeats", o.repeats},
                        {"simd_target", kernels::flash_attention_target()},
                        {"cpu", cpu_name()}});
      } else {
        fmt::print(
            "{:<5} {:>3} {:>4} {:>4} {:>4} {:>3} {:>7} {:>6} {:>10.3f} {:>9.3f} {:>11.1f} {:>8.1f} "
            "{:>8.1f} {:>7.1f}\n",
            dtype == "bfloat16" ? "bf16" : "fp32", p.B, p.Hq, p.Hkv, p.D, p.Tq, cache,
            p.window_left < 0 ? std::string("-") : std::to_string(p.window_left + 1), r.ms_median,
            r.ms_min, double(r.kv_bytes) / 1e6, r.gbs, bandwidth, pct);
        std::fflush(stdout);
      }
    }
  }
  if (o.json) {
    fmt::print("{}\n", rows.dump(1));
  } else {
    fmt::print(
        "\nms/step: median of {} steps, each one call over the whole cache, after a warm-up of "
        "250 ms;\nthe steps cycle through enough copies of the caches (>= {} MiB, the probe's "
        "buffer) that\nkeys and values come from memory. KV MB/step: the key and value bytes the "
        "step must read (the "
        "rows some\nquery sees); GB/s = that / ms/step; % bw = GB/s / bw.\n",
        o.repeats, probe_mib);
  }
  return 0;
}

}  // namespace attn::cli
