// The range of each integer flag of `attn train` (attn/train_flags.h).
#include "attn/train_flags.h"

namespace attn::train {

const std::vector<FlagRange>& integer_flag_ranges() {
  constexpr int64_t kIters = int64_t{1} << 40;
  // 0 means: --head-dim --emb-dim / --n-heads; --ffn-dim 3 x --emb-dim (a
  // decoder) or 4 x (the GPT); --epochs --max-iters; --stride --context-length;
  // --latent-dim, --sliding-window-size, --n-kv-groups off.
  // --sliding-window-stride: -1 every layer windowed, 0 none, K: K windowed
  // layers then one full.
  static const std::vector<FlagRange> ranges = {
      {"n-layers", 1, 1024, &TrainOptions::n_layers},
      {"n-heads", 1, 4096, &TrainOptions::n_heads},
      {"emb-dim", 1, 65536, &TrainOptions::emb_dim},
      {"head-dim", 0, 4096, &TrainOptions::head_dim},
      {"ffn-dim", 0, 262144, &TrainOptions::ffn_dim},
      {"context-length", 1, 1048576, &TrainOptions::context_length},
      {"batch-size", 1, 65536, &TrainOptions::batch_size},
      {"grad-accum-steps", 1, 65536, &TrainOptions::grad_accum_steps},
      {"max-iters", 0, kIters, &TrainOptions::max_iters},
      {"warmup-iters", 0, kIters, &TrainOptions::warmup_iters},
      {"eval-interval", 1, kIters, &TrainOptions::eval_interval},
      {"eval-iters", 1, 1048576, &TrainOptions::eval_iters},
      {"epochs", 0, 1048576, &TrainOptions::epochs},
      {"stride", 0, 1048576, &TrainOptions::stride},
      {"latent-dim", 0, 65536, &TrainOptions::latent_dim},
      {"sliding-window-size", 0, 1048576, &TrainOptions::sliding_window_size},
      {"sliding-window-stride", -1, 1048576, &TrainOptions::sliding_window_stride},
      {"n-kv-groups", 0, 4096, &TrainOptions::n_kv_groups},
  };
  return ranges;
}

}  // namespace attn::train
