// kernels::apply_path_environment (attn/kernels.h): the SIMD target, the bf16
// attention path and the decode GEMV's bf16 path forced from the environment,
// so that every path can be run and tested on any CPU without rebuilding:
//   ATTN_SIMD_TARGET=AVX2 attn bench ...       the AVX2 kernels on an AVX-512 CPU
//   ATTN_BF16_PATH="widened to fp32" ...       the portable bf16 attention path
//   ATTN_GEMV_BF16_PATH=widened attn generate ...   the portable bf16 decode GEMV
// Read once; an unknown name is an error naming the valid ones, every call.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "attn/decode_kernels.h"
#include "attn/kernels.h"
#include "attn/utf8.h"

namespace attn::kernels {
namespace {

// "" when the variable is set to a valid name (and applied) or unset; else the
// error. The valid names are listed only for the error: listing the bf16 paths
// orders them, and ordering them probes the machine's peaks (seconds), which a
// process that never runs bf16 attention should not pay at start.
std::string apply_one(const char* variable, std::vector<std::string> (*names)(),
                      bool (*use)(const char*)) {
  const char* value = std::getenv(variable);
  if (value == nullptr || *value == '\0') return "";
  if (use(value)) return "";
  return fmt::format("{}='{}' is not a path this CPU can run; valid: '{}'", variable,
                     printable(value), fmt::join(names(), "', '"));
}

}  // namespace

void apply_path_environment() {
  static std::once_flag once;
  static std::string error;
  std::call_once(once, [] {
    error = apply_one("ATTN_SIMD_TARGET", flash_attention_targets, flash_attention_use_target);
    if (error.empty())
      error =
          apply_one("ATTN_BF16_PATH", flash_attention_bf16_paths, flash_attention_bf16_use_path);
    if (error.empty())
      error = apply_one("ATTN_GEMV_BF16_PATH", gemv_bf16_paths, gemv_bf16_use_path);
  });
  if (!error.empty()) throw std::invalid_argument("apply_path_environment: " + error);
}

}  // namespace attn::kernels
