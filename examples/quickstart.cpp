// quickstart.cpp - the README's example: a GPT-2-small attention block, seeded
// like PyTorch, forward and backward, printed like PyTorch.
#include <iostream>

#include "attn/attn.h"

int main() {
  using namespace attn;
  manual_seed(123);
  nn::MultiHeadAttention mha({.d_in = 768, .d_out = 768, .context_length = 1024,
                              .dropout = 0.1f, .num_heads = 12, .qkv_bias = false});
  Tensor x = randn({2, 256, 768});                // (B, T, d_in)
  Tensor y = mha.forward(x);                      // (B, T, d_out)
  Tensor dx = mha.backward(Tensor::ones(y.shape()));  // dL/dx for L = sum(y)
  nn::Parameter& w = mha.parameter("W_query.weight");  // w.value, w.grad: (768, 768)
  std::cout << "parameters: " << mha.num_parameters() << "\n"
            << "y[0, :2, :4] = " << slice(slice(select(y, 0), 0, 0, 2), 1, 0, 4) << "\n"
            << "|dL/dx| has " << dx.numel() << " values; dL/dW_query[0, 0] = " << w.grad.at({0, 0})
            << "\n";
  return has_non_finite(y) || has_non_finite(dx) ? 1 : 0;
}
