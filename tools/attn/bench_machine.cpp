// bench_machine.cpp - the machine facts of `attn bench` (bench_machine.h): what
// /proc/cpuinfo, the kernels, the gemm engines and the peak probes say, as the
// header and as JSON.
#include "bench_machine.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <fstream>
#include <thread>
#include <utility>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn/decode_kernels.h"
#include "attn/gemm.h"
#include "attn/kernels.h"
#include "attn/sdpa.h"
#include "attn/utf8.h"
#include "omp_policy.h"

namespace attn::cli {
namespace {

// "family 6 model 143": /proc/cpuinfo's numbers, which name a CPU when its
// model name does not (a VM's "Intel(R) Xeon(R) Processor").
std::string cpu_family_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, family, model;
  while (std::getline(in, line) && (family.empty() || model.empty())) {
    const auto colon = line.find(':');
    if (colon == std::string::npos || colon + 2 > line.size()) continue;
    if (line.rfind("cpu family", 0) == 0) family = line.substr(colon + 2);
    if (line.rfind("model\t", 0) == 0) model = line.substr(colon + 2);
  }
  if (family.empty() || model.empty()) return "";
  return fmt::format("family {} model {}", family, model);
}

nlohmann::json probe_json(const cpu::PeakProbe& p) {
  return {{"gflops", p.gflops},
          {"threads", p.threads},
          {"chains", p.chains},
          {"lanes", p.lanes},
          {"flops_per_cycle", p.flops_per_cycle},
          {"expected_per_cycle", p.expected_per_cycle},
          {"plausible", p.plausible},
          {"verdict", p.verdict}};
}

// "428.9 GFLOP/s = 65.0 FLOP/cycle/core: 2 FMA units x 16 lanes (24 chains)",
// flagged when not plausible.
std::string probe_text(const cpu::PeakProbe& p) {
  if (p.gflops <= 0) return p.verdict;
  if (p.flops_per_cycle <= 0)
    return fmt::format("{:.1f} GFLOP/s ({} chains; {})", p.gflops, p.chains, p.verdict);
  return fmt::format("{:.1f} GFLOP/s = {:.1f} FLOP/cycle/core: {}{} ({} chains)", p.gflops,
                     p.flops_per_cycle, p.plausible ? "" : "IMPLAUSIBLE, ", p.verdict, p.chains);
}

// The variables that decide whether idle OpenMP threads spin (bench.h).
std::string wait_policy() {
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  const auto chosen = choose_omp_policy([](const char* name) { return std::getenv(name); });
  return fmt::format("GOMP_SPINCOUNT={}, OMP_WAIT_POLICY={}; {}", spin ? spin : "unset",
                     policy ? policy : "unset", chosen.text);
}

}  // namespace

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

Machine machine_facts(bool measure) {
  Machine m;
  m.cpu = cpu_name();
  m.family_model = cpu_family_model();
  m.simd_target = kernels::flash_attention_target();
  m.simd_targets = kernels::flash_attention_targets();
  m.bf16_path = kernels::flash_attention_bf16_path();
  m.bf16_paths = kernels::flash_attention_bf16_paths();
  m.sdpa_bf16_path = fmt::format("{} ({})", kernels::sdpa_bf16_path(), kernels::sdpa_target());
  m.gemv_bf16_path = kernels::gemv_bf16_path();
  m.gemv_bf16_paths = kernels::gemv_bf16_paths();
  m.fast_gemm = gemm::fast_gemm_name();
  m.fast_gemm_engine = gemm::fast_gemm_engine();
  m.fast_gemm_reason = gemm::fast_gemm_reason();
  m.blas = gemm::blas_name();
  m.gemm_bf16 = gemm::gemm_bf16_name();
  m.gemm_bf16_route = gemm::gemm_bf16_route();
  m.gemm_bf16_reason = gemm::gemm_bf16_reason();
  if (measure) {
    m.fma = cpu::fma_peak_probe(5);
    m.bf16 = cpu::bf16_dot_peak_probe(5);
    m.amx = cpu::amx_bf16_peak_probe(5);
    m.clock_ghz = m.fma.clock_ghz;
  }
  return m;
}

nlohmann::json machine_json(const Machine& m, bool measured) {
  nlohmann::json j = {{"cpu", m.cpu},
                      {"cpu_family_model", m.family_model},
                      {"simd_target", m.simd_target},
                      {"simd_targets", m.simd_targets},
                      {"bf16_path", m.bf16_path},
                      {"bf16_paths", m.bf16_paths},
                      {"sdpa_bf16_path", m.sdpa_bf16_path},
                      {"gemv_bf16_path", m.gemv_bf16_path},
                      {"gemv_bf16_paths", m.gemv_bf16_paths},
                      {"fast_gemm", m.fast_gemm},
                      {"fast_gemm_engine", m.fast_gemm_engine},
                      {"fast_gemm_reason", m.fast_gemm_reason},
                      {"blas", m.blas},
                      {"gemm_bf16", m.gemm_bf16},
                      {"gemm_bf16_route", m.gemm_bf16_route},
                      {"gemm_bf16_reason", m.gemm_bf16_reason}};
  j["peaks_measured"] = measured;
  j["clock_ghz"] = measured ? nlohmann::json(m.clock_ghz) : nlohmann::json(nullptr);
  j["fma_peak"] = measured ? probe_json(m.fma) : nlohmann::json(nullptr);
  j["bf16_dot_peak"] = measured ? probe_json(m.bf16) : nlohmann::json(nullptr);
  j["amx_bf16_peak"] = measured ? probe_json(m.amx) : nlohmann::json(nullptr);
  return j;
}

void print_machine_header(const Machine& m, bool peaks_measured, const SgemmYardstick& sgemm,
                          int repeats) {
  const std::string& target = m.simd_target;  // the kernels' target, after any --target
  const double peak = m.fma.gflops;
  const double bf16_peak = m.bf16.gflops > 0 ? m.bf16.gflops : -1;
  fmt::print("attn bench: {}{}, {} CPUs, {} OpenMP threads, {} BLAS threads\n", m.cpu,
             m.family_model.empty() ? "" : " (" + m.family_model + ")",
             std::thread::hardware_concurrency(), omp_threads(), gemm::blas_threads());
  fmt::print("SIMD target {} (this CPU runs: {}; ATTN_SIMD_TARGET or --target forces one)\n",
             target, fmt::join(m.simd_targets, ", "));
  fmt::print("{}\n", wait_policy());
  if (peaks_measured) {
    fmt::print(
        "core clock {:.2f} GHz (a chain of dependent integer adds; FLOP/cycle below is per "
        "thread at this clock)\n",
        m.clock_ghz);
    fmt::print("fp32 FMA peak ({}, {} threads, median of 5): {}\n", target, omp_threads(),
               probe_text(m.fma));
    fmt::print("bf16 dot-product peak (AVX512-BF16 VDPBF16PS): {}{}\n", probe_text(m.bf16),
               bf16_peak > 0 && peak > 0 ? fmt::format(", {:.2f}x the fp32 peak", bf16_peak / peak)
                                         : std::string());
    fmt::print("AMX bf16 peak (TDPBF16PS): {}\n", probe_text(m.amx));
  } else {
    fmt::print("peaks not measured (--no-probe): no clock, no FLOP/cycle, % peak is -\n");
  }
  fmt::print(
      "paths: flash kernel {}; bf16 attention {} (of: {}; ATTN_BF16_PATH or "
      "--bf16-path forces one); sdpa bf16 {}; decode gemv bf16 {} (of: {}; "
      "ATTN_GEMV_BF16_PATH forces one)\n",
      target, m.bf16_path, fmt::join(m.bf16_paths, ", "), m.sdpa_bf16_path, m.gemv_bf16_path,
      fmt::join(m.gemv_bf16_paths, ", "));
  fmt::print(
      "gemm: fast engine {} ({}; ATTN_GEMM_ENGINE=onednn|blas forces one); BLAS {}; "
      "bf16 gemm {} (route {}: {}; ATTN_BF16_GEMM=matmul|widened forces one)\n",
      m.fast_gemm, m.fast_gemm_reason, m.blas, m.gemm_bf16, m.gemm_bf16_route,
      m.gemm_bf16_reason);
  // "= 12.3% of peak", or nothing where the peak was not measured.
  const auto of_peak = [&](double rate) {
    return peak > 0 ? fmt::format(" = {:.1f}% of peak", 100.0 * rate / peak) : std::string();
  };
  fmt::print("sgemm {}^3, BLAS engine ({}, median of {}): {:.1f} GFLOP/s{}\n", sgemm.n,
             gemm::blas_name(), sgemm.runs, sgemm.blas, of_peak(sgemm.blas));
  fmt::print(
      "sgemm {}^3, fast engine ({}, median of {}): {:.1f} GFLOP/s{}; % sgemm "
      "below is of the faster; {} repeats per case after a warm-up of 250 ms\n",
      sgemm.n, gemm::fast_gemm_name(), sgemm.runs, sgemm.fast, of_peak(sgemm.fast), repeats);
  for (const auto* probe : {&m.fma, &m.bf16, &m.amx}) {
    if (probe->gflops > 0 && probe->flops_per_cycle > 0 && !probe->plausible)
      fmt::print("warning: a peak probe reads {:.1f} FLOP/cycle/core, {}\n",
                 probe->flops_per_cycle, probe->verdict);
  }
  // Nothing runs faster than the machine: a product above the measured
  // peak means the probe under-reads this CPU, and every "% peak" is too high.
  for (const auto& [name, rate] : {std::pair{gemm::blas_name(), sgemm.blas},
                                   std::pair{gemm::fast_gemm_name(), sgemm.fast}}) {
    if (peak > 0 && rate > peak)
      fmt::print(
          "warning: sgemm on {} runs at {:.1f}% of the measured fp32 FMA peak: the probe is "
          "wrong (it under-reads this CPU), so the % peak figures below are too high\n",
          name, 100.0 * rate / peak);
  }
  // An engine far below the peak (an old OpenBLAS on a newer CPU, or
  // OPENBLAS_CORETYPE pinned to an old core) slows whatever runs on it.
  const char* coretype = std::getenv("OPENBLAS_CORETYPE");
  const std::string pinned = coretype != nullptr
                                 ? fmt::format(" (OPENBLAS_CORETYPE={})", printable(coretype))
                                 : std::string();
  if (peak > 0 && sgemm.blas < 0.5 * peak) {
    fmt::print(
        "warning: the BLAS engine ({}{}) runs sgemm at {:.1f}% of the fp32 FMA peak; the "
        "chapter modules keep it for PyTorch's sums, the GPT, training, generation, the "
        "fused paths and the benchmarks use the fast engine ({}, {}); a busy machine reads "
        "low too\n",
        gemm::blas_name(), pinned, 100.0 * sgemm.blas / peak, gemm::fast_gemm_name(),
        gemm::fast_gemm_reason());
  }
  if (peak > 0 && sgemm.fast < 0.5 * peak)
    fmt::print(
        "warning: the fast engine ({}{}) runs sgemm at {:.1f}% of the fp32 FMA peak (or "
        "the machine is busy: the peaks are timed on CPU time, sgemm on the wall "
        "clock)\n",
        gemm::fast_gemm_name(), gemm::fast_gemm_engine() == std::string("blas") ? pinned : "",
        100.0 * sgemm.fast / peak);
}

int omp_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void set_threads(int n) {
#ifdef _OPENMP
  omp_set_num_threads(n);
#endif
  gemm::set_blas_threads(n);
}

}  // namespace attn::cli
