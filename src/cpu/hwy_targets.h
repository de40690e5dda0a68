// src/cpu/hwy_targets.h - the SIMD targets the kernel files compile for
// with Highway's dynamic dispatch. Include it before <hwy/foreach_target.h>.
// SSSE3 and AVX3_DL add nothing for fp32 over SSE4 and AVX3: fewer copies to
// compile, and the FMA-peak probe measures exactly the kernel's targets.
#pragma once

#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_AVX3_DL)
#endif
