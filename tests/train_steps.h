// train_steps.h - what the Trainer tests (test_train.cpp, test_train_decoder.cpp)
// share: the CLI's loop as losses, and every weight of a trained model.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/train.h"

namespace attn::test {

// The CLI's loop: evaluate at every eval_interval (once), then step, until
// iteration `until`; the evaluations' train and validation losses and each
// step's loss, in order.
inline std::vector<double> run_losses(train::Trainer& t, int64_t until) {
  std::vector<double> losses;
  while (true) {
    const int64_t it = t.iter();
    if ((it % t.options().eval_interval == 0 || it == t.options().max_iters) &&
        t.last_eval_iter() != it) {
      const auto r = t.evaluate();
      losses.push_back(r.train_loss);
      losses.push_back(r.val_loss);
    }
    if (it >= until) break;
    losses.push_back(t.step());
  }
  return losses;
}

// Every parameter's values, in named_parameters() order (GPT or decoder).
inline std::vector<float> all_weights(train::Trainer& t) {
  std::vector<float> w;
  for (auto& [name, p] : t.lm().module().named_parameters()) {
    const float* v = p->value.data();
    w.insert(w.end(), v, v + p->value.numel());
  }
  return w;
}

}  // namespace attn::test
