// gemm_route_guard.h - forces one route of gemm::gemm_bf16 (gemm_bf16_use) for
// the life of a test scope, then gives the choice back to the automatic rule,
// also when an ASSERT leaves the scope early.
#pragma once

#include <string>

#include "attn/gemm.h"

namespace attn::test {

class GemmBf16RouteGuard {
 public:
  explicit GemmBf16RouteGuard(const std::string& route)
      : forced_(gemm::gemm_bf16_use(route.c_str())) {}
  ~GemmBf16RouteGuard() { gemm::gemm_bf16_use(nullptr); }
  GemmBf16RouteGuard(const GemmBf16RouteGuard&) = delete;
  GemmBf16RouteGuard& operator=(const GemmBf16RouteGuard&) = delete;
  bool forced() const { return forced_; }  // false: no such route here

 private:
  bool forced_;
};

}  // namespace attn::test
