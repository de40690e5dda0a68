// The CPU's features, asked at run time (attn/cpu.h).
#include "attn/cpu.h"

#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace attn::cpu {
namespace {

#if defined(__x86_64__)
constexpr long kArchReqXcompPerm = 0x1023;
constexpr long kXfeatureXtiledata = 18;

bool cpu_and_os_have_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1)) return false;  // OSXSAVE
  uint32_t lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((lo >> 17) & 3) == 3;  // XCR0: XTILECFG and XTILEDATA enabled
}
#endif

}  // namespace

bool has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f");
}

bool has_amx_bf16() {
#if defined(__x86_64__) && defined(__linux__)
  static const bool has = cpu_and_os_have_amx_bf16() &&
                          syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return has;
#else
  return false;
#endif
}

}  // namespace attn::cpu
