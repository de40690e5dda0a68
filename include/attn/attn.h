// attn/attn.h - everything: tensors, PyTorch's random numbers, the reference
// maths, the fused kernels, the BLAS seam and the modules.
#pragma once

#include "attn/atomic_file.h"
#include "attn/functional.h"
#include "attn/functional_gpt.h"
#include "attn/fused.h"
#include "attn/gemm.h"
#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/hf_gpt2.h"
#include "attn/kernels.h"
#include "attn/kv_cache.h"
#include "attn/layer_kernels.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/optim.h"
#include "attn/print.h"
#include "attn/random.h"
#include "attn/safetensors.h"
#include "attn/tensor.h"
#include "attn/train.h"
#include "attn/utf8.h"
