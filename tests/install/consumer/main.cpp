// A program that uses attn the way another project would (through
// find_package(attn) or add_subdirectory): the chapter's MultiHeadAttention on
// its six-token batch, checked against what PyTorch 1.13 prints for
//   torch.manual_seed(123); MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)(batch)
// Exit status 0 only if every value agrees.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <vector>

#include <attn/attn.h>

int main() {
  using namespace attn;
  const Tensor inputs = Tensor::of({6, 3}, {0.43f, 0.15f, 0.89f,    // Your
                                            0.55f, 0.87f, 0.66f,    // journey
                                            0.57f, 0.85f, 0.64f,    // starts
                                            0.22f, 0.58f, 0.33f,    // with
                                            0.77f, 0.25f, 0.10f,    // one
                                            0.05f, 0.80f, 0.55f});  // step
  const Tensor batch = stack({inputs, inputs});

  manual_seed(123);
  nn::MultiHeadAttention mha({.d_in = 3, .d_out = 2, .context_length = 6, .num_heads = 2});
  const Tensor y = mha.forward(batch);
  std::cout << y << "\n";

  const float expected[6][2] = {{0.3190183f, 0.4857629f}, {0.2943460f, 0.3896763f},
                                {0.2855747f, 0.3592777f}, {0.2692637f, 0.3873267f},
                                {0.2638705f, 0.3927957f}, {0.2574736f, 0.4027826f}};
  if (y.shape() != Shape{2, 6, 2}) {
    std::cerr << "attn consumer: expected shape (2, 6, 2), got " << shape_str(y.shape()) << "\n";
    return 1;
  }
  float worst = 0.0f;
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t t = 0; t < 6; ++t) {
      for (int64_t j = 0; j < 2; ++j) {
        worst = std::max(worst, std::fabs(y.at({b, t, j}) - expected[t][j]));
      }
    }
  }
  std::printf("attn consumer: %lld parameters, max |y - PyTorch| = %.2e\n",
              static_cast<long long>(mha.num_parameters()), static_cast<double>(worst));
  if (!(worst <= 1e-5f)) {
    std::fprintf(stderr, "attn consumer: FAILED, MultiHeadAttention differs from PyTorch\n");
    return 1;
  }
  // GPT-2's tokenizer: its vocabulary is inside the library, its Unicode
  // classes come from PCRE2 (a private dependency the package must bring).
  const std::vector<int64_t> ids = text::Tokenizer::gpt2().encode("Hello, I am");
  if (ids != std::vector<int64_t>{15496, 11, 314, 716}) {
    std::fprintf(stderr, "attn consumer: FAILED, \"Hello, I am\" is not 15496 11 314 716\n");
    return 1;
  }
  std::printf("attn consumer: OK\n");
  return 0;
}
