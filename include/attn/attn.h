// attn/attn.h - everything: tensors, PyTorch's random numbers, the reference
// maths, the fused kernels, the BLAS seam, the modules, the model files, the
// tokenizers and training; and the library's version.
#pragma once

#include "attn/atomic_file.h"
#include "attn/bfloat16.h"
#include "attn/char_tokenizer.h"
#include "attn/checkpoint.h"
#include "attn/cpu.h"
#include "attn/decode_attention.h"
#include "attn/fnv1a.h"
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
#include "attn/mapped_file.h"
#include "attn/model_config.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/optim.h"
#include "attn/print.h"
#include "attn/random.h"
#include "attn/rope.h"
#include "attn/safetensors.h"
#include "attn/sdpa.h"
#include "attn/sdpa_strided.h"
#include "attn/state_dict.h"
#include "attn/tensor.h"
#include "attn/token_shards.h"
#include "attn/tokenizer.h"
#include "attn/train.h"
#include "attn/utf8.h"

namespace attn {

// The library's version ("0.1.0"): the file VERSION, through CMake's project version.
const char* version();

}  // namespace attn
