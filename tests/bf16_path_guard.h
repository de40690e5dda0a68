// bf16_path_guard.h - forces one bf16 attention path (kernels::flash_attention_bf16_use_path)
// for the life of a test, then puts back the one that was chosen before.
#pragma once

#include <string>

#include "attn/kernels.h"

namespace attn::test {

class Bf16PathGuard {
 public:
  explicit Bf16PathGuard(const char* name)
      : previous_(kernels::flash_attention_bf16_path()),
        forced_(kernels::flash_attention_bf16_use_path(name)) {}
  ~Bf16PathGuard() { kernels::flash_attention_bf16_use_path(previous_.c_str()); }
  Bf16PathGuard(const Bf16PathGuard&) = delete;
  Bf16PathGuard& operator=(const Bf16PathGuard&) = delete;
  bool forced() const { return forced_; }  // false: this CPU has no such path

 private:
  std::string previous_;
  bool forced_;
};

}  // namespace attn::test
