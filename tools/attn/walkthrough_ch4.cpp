// walkthrough_ch4.cpp - `attn walkthrough --chapter 4`: the GPT chapter's
// notebook, print by print.
//
// Each section follows the notebook's cells (tests/torch/oracle_walkthrough_ch4.py
// runs the same code in PyTorch). The models run on attn's reference paths
// (attention, LayerNorm and GELU in PyTorch's float order) so that the printed
// digits are torch's; both forward passes run in training mode, as in the
// notebook (model.eval() comes only before generation), so their dropout masks
// are drawn from the seeded generator in PyTorch's order.
#include "walkthrough_ch4.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>

#include "attn/gpt.h"
#include "attn/nn.h"
#include "attn/ops.h"
#include "attn/print.h"
#include "attn/random.h"
#include "attn/tokenizer.h"
#include "attn/train_book.h"
#include "attn/utf8.h"

namespace attn::cli {
namespace {

constexpr uint64_t kBookSeed = 123;  // the notebook's torch.manual_seed(123)
const char* const kText1 = "Every effort moves you";
const char* const kText2 = "Every day holds a";
const char* const kStartContext = "Hello, I am";
constexpr int64_t kMaxNewTokens = 6;
constexpr int64_t kBytesPerParameter = 4;  // float32
constexpr double kBytesPerMB = 1024.0 * 1024.0;

// ---- Python's and PyTorch's spellings ----------------------------------------------------

// torch.Size([2, 4, 50257])
std::string torch_size(const Shape& shape) {
  return fmt::format("torch.Size([{}])", fmt::join(shape, ", "));
}

// Python's list repr of ints: [15496, 11, 314, 716]
std::string python_list(const std::vector<int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

// f"{n:,}": 163,009,536
std::string with_commas(int64_t n) {
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

nlohmann::json tensor_json(const Tensor& t) {
  nlohmann::json values = nlohmann::json::array();
  if (t.dtype() == DType::kInt64) {
    for (int64_t v : t.to_int64_vector()) values.push_back(v);
  } else {
    for (float v : t.to_vector()) values.push_back(v);
  }
  return {{"shape", t.shape()}, {"values", std::move(values)}};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- the notebook's state, shared by the sections ---------------------------------------

struct Notebook {
  std::vector<Printed>* out = nullptr;
  ProgressFn progress;
  std::string section;
  std::unique_ptr<nn::GPTModel> model;  // GPTModel(GPT_CONFIG_124M), built by "gpt" or "generate"
  // torch's print options where the section's cells are: the notebook calls
  // torch.set_printoptions(sci_mode=False) in the layer-norm cells, and it holds
  // from there on.
  PrintOptions print_options;

  std::string str(const Tensor& t) const { return to_string(t, print_options); }

  void print(std::string name, const std::string& what, const std::string& code, std::string text,
             nlohmann::json value) {
    out->push_back(Printed{section, std::move(name), fmt::format("{}: {}", what, code),
                           std::move(text), std::move(value)});
  }
  void say(const std::string& line) const {
    if (progress) progress(line);
  }

  // torch.manual_seed(123); model = GPTModel(GPT_CONFIG_124M). The reference
  // attention, LayerNorm and GELU follow PyTorch's float order; in training mode
  // the attention's dropout masks are PyTorch's.
  nn::GPTModel& gpt_model() {
    if (!model) {
      const auto start = std::chrono::steady_clock::now();
      say("GPTModel(GPT_CONFIG_124M) under torch.manual_seed(123): drawing its weights ...");
      manual_seed(kBookSeed);
      model = std::make_unique<nn::GPTModel>(
          nn::GPT_CONFIG_124M, nn::GPTOptions{.attention_backend = nn::AttentionBackend::kReference,
                                              .exact_dropout = true,
                                              .layers = nn::LayerImpl::kReference});
      say(fmt::format("GPTModel(GPT_CONFIG_124M): {} parameters in {:.1f} s",
                      with_commas(model->num_parameters()), seconds_since(start)));
    }
    return *model;
  }
};

// The two example texts as GPT-2 ids, stacked: (2, 4) int64.
Tensor example_batch() {
  const text::Tokenizer& tokenizer = text::Tokenizer::gpt2();
  const std::vector<int64_t> a = tokenizer.encode(kText1);
  const std::vector<int64_t> b = tokenizer.encode(kText2);
  if (a.size() != b.size()) {  // torch.stack needs equal lengths; GPT-2 gives 4 and 4
    throw std::logic_error(fmt::format("walkthrough: '{}' is {} tokens but '{}' is {}", kText1,
                                       a.size(), kText2, b.size()));
  }
  std::vector<int64_t> ids = a;
  ids.insert(ids.end(), b.begin(), b.end());
  return Tensor::from_int64({2, static_cast<int64_t>(a.size())}, ids);
}

// ---- 1. the batch -----------------------------------------------------------------------

void batch_section(Notebook& nb) {
  const Tensor batch = example_batch();
  nb.print(
      "batch",
      fmt::format("\"{}\" and \"{}\" as GPT-2 token ids, stacked into a batch", kText1, kText2),
      "batch = torch.stack([torch.tensor(tokenizer.encode(txt1)), "
      "torch.tensor(tokenizer.encode(txt2))], dim=0); print(batch)",
      nb.str(batch), tensor_json(batch));
}

// ---- 2. DummyGPTModel -------------------------------------------------------------------

// The chapter's first sketch: embeddings, dropout and the output layer; its
// transformer blocks and final norm are identities without parameters, so they
// draw nothing.
struct DummyGPTModel {
  nn::Embedding tok_emb;
  nn::Embedding pos_emb;
  nn::Dropout drop_emb;
  nn::Linear out_head;

  explicit DummyGPTModel(const nn::GPTConfig& cfg)
      : tok_emb({.num_embeddings = cfg.vocab_size, .embedding_dim = cfg.emb_dim}),
        pos_emb({.num_embeddings = cfg.context_length, .embedding_dim = cfg.emb_dim}),
        drop_emb({.p = cfg.drop_rate}),
        out_head({.in_features = cfg.emb_dim, .out_features = cfg.vocab_size, .bias = false}) {}

  // in_idx (B, T) int64 -> logits (B, T, V), training mode (drop_emb active).
  Tensor forward(const Tensor& in_idx) {
    const int64_t T = in_idx.size(1);
    std::vector<int64_t> positions(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = t;  // torch.arange(T)
    Tensor x = add(tok_emb.forward(in_idx), pos_emb.forward(positions));    // (B, T, E)
    x = drop_emb.forward(x);
    return out_head.forward(x);  // (B, T, V)
  }
};

void dummy_section(Notebook& nb) {
  const Tensor batch = example_batch();
  const auto start = std::chrono::steady_clock::now();
  nb.say("DummyGPTModel(GPT_CONFIG_124M) under torch.manual_seed(123) ...");
  manual_seed(kBookSeed);
  Tensor logits;
  {
    DummyGPTModel model(nn::GPT_CONFIG_124M);
    logits = model.forward(batch);  // (2, 4, 50257)
  }
  nb.say(fmt::format("DummyGPTModel: built and run in {:.1f} s", seconds_since(start)));
  nb.print("logits.shape", "the DummyGPTModel's output: one score per vocabulary entry per token",
           "torch.manual_seed(123); model = DummyGPTModel(GPT_CONFIG_124M); logits = model(batch); "
           "print(\"Output shape:\", logits.shape)",
           "Output shape: " + torch_size(logits.shape()), logits.shape());
  nb.print("logits", "its logits (training mode: drop_emb zeroes 10% of the embeddings)",
           "print(logits)", nb.str(logits), tensor_json(logits));
}

// ---- 3. layer normalization ------------------------------------------------------------

// x.var(dim=-1, keepdim=True, unbiased=...) of a 2-D x: (N, C) -> (N, 1). Summed in
// double and rounded once, as PyTorch's Welford reduction accumulates in double.
Tensor row_variance(const Tensor& x, bool unbiased) {
  const int64_t N = x.size(0), C = x.size(1);
  const std::vector<float> v = x.to_vector();
  Tensor out({N, 1});
  for (int64_t n = 0; n < N; ++n) {
    double mean = 0.0;
    for (int64_t c = 0; c < C; ++c) mean += static_cast<double>(v[static_cast<size_t>(n * C + c)]);
    mean /= static_cast<double>(C);
    double m2 = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const double d = static_cast<double>(v[static_cast<size_t>(n * C + c)]) - mean;
      m2 += d * d;
    }
    out[n] = static_cast<float>(m2 / static_cast<double>(unbiased ? C - 1 : C));
  }
  return out;
}

Tensor relu(const Tensor& x) {
  Tensor out = x.contiguous();
  for (float& v : out.values()) v = v > 0.0f ? v : 0.0f;  // torch.relu: max(x, 0)
  return out;
}

// torch.manual_seed(123); batch_example = torch.randn(2, 5);
// layer = nn.Sequential(nn.Linear(5, 6), nn.ReLU()); out = layer(batch_example)
Tensor layer_example_out() {
  manual_seed(kBookSeed);
  const Tensor batch_example = randn({2, 5});
  nn::Linear linear({.in_features = 5, .out_features = 6});
  return relu(linear.forward(batch_example));  // (2, 6)
}

void layernorm_section(Notebook& nb) {
  const Tensor out = layer_example_out();
  nb.print("out", "a layer's outputs: two examples of 5 features through Linear(5, 6) and ReLU",
           "torch.manual_seed(123); batch_example = torch.randn(2, 5); layer = "
           "nn.Sequential(nn.Linear(5, 6), nn.ReLU()); out = layer(batch_example); print(out)",
           nb.str(out), tensor_json(out));
  const auto print_mean_var = [&nb](const Tensor& mean, const Tensor& var,
                                    const std::string& what_mean, const std::string& code_mean,
                                    const std::string& what_var, const std::string& code_var) {
    nb.print("mean", what_mean, code_mean, "Mean:\n " + nb.str(mean), tensor_json(mean));
    nb.print("var", what_var, code_var, "Variance:\n " + nb.str(var), tensor_json(var));
  };
  Tensor mean = attn::mean(out, -1, /*keepdim=*/true);  // (2, 1)
  Tensor var = row_variance(out, /*unbiased=*/true);    // (2, 1)
  print_mean_var(mean, var, "each row's mean",
                 "mean = out.mean(dim=-1, keepdim=True); print(\"Mean:\\n\", mean)",
                 "each row's variance (unbiased: divided by n - 1)",
                 "var = out.var(dim=-1, keepdim=True); print(\"Variance:\\n\", var)");

  const Tensor out_norm = div(sub(out, mean), sqrt(var));  // (2, 6)
  nb.print("out_norm", "normalised: the mean subtracted, divided by the standard deviation",
           "out_norm = (out - mean) / torch.sqrt(var); "
           "print(\"Normalized layer outputs:\\n\", out_norm)",
           "Normalized layer outputs:\n " + nb.str(out_norm), tensor_json(out_norm));
  mean = attn::mean(out_norm, -1, true);
  var = row_variance(out_norm, true);
  print_mean_var(mean, var, "now mean 0, up to float rounding",
                 "mean = out_norm.mean(dim=-1, keepdim=True); print(\"Mean:\\n\", mean)",
                 "and variance 1",
                 "var = out_norm.var(dim=-1, keepdim=True); print(\"Variance:\\n\", var)");

  nb.print_options.sci_mode = false;
  print_mean_var(mean, var,
                 "the same, without scientific notation (PyTorch 1.13 keeps the scientific width)",
                 "torch.set_printoptions(sci_mode=False); print(\"Mean:\\n\", mean)",
                 "the variance again", "print(\"Variance:\\n\", var)");

  nn::LayerNorm ln(6, 1e-5f, nn::LayerImpl::kReference);
  const Tensor out_ln = ln.forward(out);  // (2, 6)
  mean = attn::mean(out_ln, -1, true);
  var = row_variance(out_ln, /*unbiased=*/false);
  print_mean_var(mean, var, "the book's LayerNorm(emb_dim=6) (scale 1, shift 0, eps 1e-5): mean 0",
                 "ln = LayerNorm(emb_dim=6); out_ln = ln(out); "
                 "mean = out_ln.mean(dim=-1, keepdim=True); print(\"Mean:\\n\", mean)",
                 "variance just under 1 (the eps under the square root)",
                 "var = out_ln.var(dim=-1, unbiased=False, keepdim=True); "
                 "print(\"Variance:\\n\", var)");
}

// ---- 4. the feed-forward network ---------------------------------------------------------

void feedforward_section(Notebook& nb) {
  const int64_t emb_dim = nn::GPT_CONFIG_124M.emb_dim;
  nb.print("GPT_CONFIG_124M[\"emb_dim\"]", "the embedding width the feed-forward keeps",
           "print(GPT_CONFIG_124M[\"emb_dim\"])", std::to_string(emb_dim), emb_dim);
  // The notebook draws these after the layer-norm cells, without a new seed.
  layer_example_out();
  nn::FeedForward ffn(nn::GPT_CONFIG_124M, default_generator(), nn::LayerImpl::kReference);
  const Tensor x = rand({2, 3, emb_dim});  // (batch_size, num_tokens, emb_size)
  const Tensor out = ffn.forward(x);       // (2, 3, 768)
  nb.print("out.shape", "Linear(768, 3072), GELU, Linear(3072, 768): the shape is kept",
           "ffn = FeedForward(GPT_CONFIG_124M); x = torch.rand(2, 3, 768); out = ffn(x); "
           "print(out.shape)",
           torch_size(out.shape()), out.shape());
}

// ---- 5. shortcut connections ------------------------------------------------------------

// One layer of the notebook's ExampleDeepNeuralNetwork: Sequential(Linear, GELU),
// the book's GELU as PyTorch evaluates it, op by op in float, keeping what its
// autograd backward reads:
//   t1 = 0.5 * z;  p = z * z * z;  r = z + 0.044715 * p;  s = c * r  (c = sqrt(2/pi) as float)
//   th = tanh(s);  u = 1 + th;     y = t1 * u
// The backward is autograd's, node by node: mul -> (gy u, gy t1); tanh -> g (1 - th th);
// mul by c; add; mul by 0.044715; pow -> g (3 z^2) (z^2 as z * z); mul by 0.5. The three
// gradients of z are summed in the order the engine delivers them (the add's, the
// pow's, then the 0.5 mul's: higher sequence numbers first), so every bit is torch's.
class ExampleLayer {
 public:
  ExampleLayer(int64_t in, int64_t out) : linear_({.in_features = in, .out_features = out}) {}

  Tensor forward(const Tensor& x) {
    z_ = linear_.forward(x);  // (1, out)
    const int64_t n = z_.numel();
    t1_.assign(static_cast<size_t>(n), 0.0f);
    u_ = t1_;
    th_ = t1_;
    Tensor y(z_.shape());
    const std::vector<float> z = z_.to_vector();
    for (size_t i = 0; i < z.size(); ++i) {
      t1_[i] = z[i] * 0.5f;
      const float p = z[i] * z[i] * z[i];
      const float r = z[i] + p * kGeluCubic;
      th_[i] = std::tanh(kSqrt2OverPi * r);
      u_[i] = th_[i] + 1.0f;
      y[static_cast<int64_t>(i)] = t1_[i] * u_[i];
    }
    return y;
  }

  // gy (1, out) -> dx (1, in); accumulates linear.weight.grad.
  Tensor backward(const Tensor& gy_t) {
    const std::vector<float> gy = gy_t.to_vector();
    const std::vector<float> z = z_.to_vector();
    Tensor gz(z_.shape());
    for (size_t i = 0; i < z.size(); ++i) {
      const float g_t1 = gy[i] * u_[i];
      const float g_u = gy[i] * t1_[i];
      const float g_s = g_u * (1.0f - th_[i] * th_[i]);
      const float g_r = g_s * kSqrt2OverPi;
      const float g_p = g_r * kGeluCubic;
      const float g_pow = g_p * ((z[i] * z[i]) * 3.0f);
      const float g_half = g_t1 * 0.5f;
      gz[static_cast<int64_t>(i)] = (g_r + g_pow) + g_half;
    }
    return linear_.backward(gz);
  }

  nn::Linear& linear() { return linear_; }

 private:
  static constexpr float kGeluCubic = 0.044715f;
  // torch.sqrt(torch.tensor(2.0 / torch.pi)): the double quotient rounded to float, then sqrt.
  inline static const float kSqrt2OverPi = std::sqrt(static_cast<float>(2.0 / 3.141592653589793));
  nn::Linear linear_;
  Tensor z_;                        // (1, out) the Linear's output
  std::vector<float> t1_, u_, th_;  // (out) each
};

// torch.manual_seed(123); model = ExampleDeepNeuralNetwork(layer_sizes, use_shortcut);
// print_gradients(model, sample_input): MSE of the output against 0, backward, then
// each weight's mean absolute gradient.
void print_gradients(Notebook& nb, bool use_shortcut) {
  const std::vector<int64_t> layer_sizes = {3, 3, 3, 3, 3, 1};
  manual_seed(kBookSeed);
  std::vector<std::unique_ptr<ExampleLayer>> layers;
  for (size_t i = 0; i + 1 < layer_sizes.size(); ++i) {
    layers.push_back(std::make_unique<ExampleLayer>(layer_sizes[i], layer_sizes[i + 1]));
  }
  Tensor x = Tensor::of({1, 3}, {1.0f, 0.0f, -1.0f});  // sample_input
  std::vector<bool> shortcut(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const Tensor layer_output = layers[i]->forward(x);
    shortcut[i] = use_shortcut && x.shape() == layer_output.shape();
    x = shortcut[i] ? add(x, layer_output) : layer_output;
  }
  // nn.MSELoss() against [[0.]], mean over one element: dloss/doutput = 2 (output - 0).
  Tensor g = mul(x, 2.0f);
  for (size_t i = layers.size(); i-- > 0;) {
    const Tensor through_layer = layers[i]->backward(g);
    g = shortcut[i] ? add(g, through_layer) : through_layer;  // x + layer(x): both paths
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string name = fmt::format("layers.{}.0.weight", i);
    Tensor abs_grad = layers[i]->linear().weight.grad.contiguous();
    for (float& v : abs_grad.values()) v = std::fabs(v);
    const float m = attn::mean(abs_grad.reshape({abs_grad.numel()}), 0).to_vector()[0];
    // .item() is a Python float: the float32 value as a double, printed by repr (shortest).
    nb.print(name,
             fmt::format("the mean |gradient| of {}, {}", name,
                         use_shortcut ? "with shortcuts (large all the way down)"
                                      : "without shortcuts (vanishing towards layer 0)"),
             fmt::format("print_gradients(model_{}, sample_input)",
                         use_shortcut ? "with_shortcut" : "without_shortcut"),
             fmt::format("{} has gradient mean of {}", name, static_cast<double>(m)),
             static_cast<double>(m));
  }
}

void shortcut_section(Notebook& nb) {
  print_gradients(nb, /*use_shortcut=*/false);
  print_gradients(nb, /*use_shortcut=*/true);
}

// ---- 6. a transformer block -----------------------------------------------------------

void block_section(Notebook& nb) {
  manual_seed(kBookSeed);
  const Tensor x = rand({2, 4, nn::GPT_CONFIG_124M.emb_dim});  // (batch_size, num_tokens, emb_dim)
  nn::TransformerBlock block(nn::GPT_CONFIG_124M,
                             nn::GPTOptions{.attention_backend = nn::AttentionBackend::kReference,
                                            .exact_dropout = true,
                                            .layers = nn::LayerImpl::kReference});
  const Tensor output = block.forward(x);  // training mode, as in the notebook
  nb.print("x.shape", "a batch of 2 x 4 tokens of width 768 into TransformerBlock(GPT_CONFIG_124M)",
           "torch.manual_seed(123); x = torch.rand(2, 4, 768); block = "
           "TransformerBlock(GPT_CONFIG_124M); output = block(x); print(\"Input shape:\", x.shape)",
           "Input shape: " + torch_size(x.shape()), x.shape());
  nb.print("output.shape",
           "comes out the same shape: attention and feed-forward, each with a shortcut",
           "print(\"Output shape:\", output.shape)", "Output shape: " + torch_size(output.shape()),
           output.shape());
}

// ---- 7. GPTModel ------------------------------------------------------------------------

void gpt_section(Notebook& nb) {
  const Tensor batch = example_batch();
  nn::GPTModel& model = nb.gpt_model();
  model.train();  // nn.Module starts in training mode; the notebook does not call eval() yet
  const auto start = std::chrono::steady_clock::now();
  const Tensor out = model.forward(batch);  // (2, 4, 50257)
  nb.say(fmt::format("GPTModel forward of the (2, 4) batch: {:.1f} s", seconds_since(start)));

  nb.print("batch", "the input batch", "print(\"Input batch:\\n\", batch)",
           "Input batch:\n " + nb.str(batch), tensor_json(batch));
  nb.print("out.shape", "the GPTModel's output: one score per vocabulary entry per token",
           "torch.manual_seed(123); model = GPTModel(GPT_CONFIG_124M); out = model(batch); "
           "print(\"\\nOutput shape:\", out.shape)",
           "\nOutput shape: " + torch_size(out.shape()), out.shape());
  nb.print("out", "its logits (training mode: dropout in every block)", "print(out)", nb.str(out),
           tensor_json(out));

  const int64_t total_params = model.num_parameters();
  nb.print("total_params", "every parameter counted, out_head not tied to tok_emb",
           "total_params = sum(p.numel() for p in model.parameters())",
           fmt::format("Total number of parameters: {}", with_commas(total_params)), total_params);
  const Shape tok_shape = model.tok_emb.weight.value.shape();
  const Shape out_shape = model.out_head.weight.value.shape();
  nb.print("model.tok_emb.weight.shape", "the token embedding (vocab_size, emb_dim)",
           "print(\"Token embedding layer shape:\", model.tok_emb.weight.shape)",
           "Token embedding layer shape: " + torch_size(tok_shape), tok_shape);
  nb.print("model.out_head.weight.shape", "the output layer has the same shape",
           "print(\"Output layer shape:\", model.out_head.weight.shape)",
           "Output layer shape: " + torch_size(out_shape), out_shape);
  const int64_t total_params_gpt2 = total_params - model.out_head.num_parameters();
  nb.print("total_params_gpt2", "GPT-2 ties the two, so out_head's weights are not counted",
           "total_params_gpt2 = total_params - sum(p.numel() for p in model.out_head.parameters())",
           fmt::format("Number of trainable parameters considering weight tying: {}",
                       with_commas(total_params_gpt2)),
           total_params_gpt2);
  const double total_size_mb = static_cast<double>(total_params * kBytesPerParameter) / kBytesPerMB;
  nb.print("total_size_mb", "4 bytes (float32) per parameter",
           "total_size_mb = total_params * 4 / (1024 * 1024)",
           fmt::format("Total size of the model: {:.2f} MB", total_size_mb), total_size_mb);
}

// ---- 8. generate_text_simple ------------------------------------------------------------

}  // namespace

// The book's generate_text_simple: for max_new_tokens steps, the logits of the
// last position of the last context_size tokens, softmax, argmax (the first
// maximum, as torch.argmax), appended. idx (B, T) int64 -> (B, T + max_new_tokens).
Tensor generate_text_simple(nn::GPTModel& model, const Tensor& idx, int64_t max_new_tokens,
                            int64_t context_size, const ProgressFn& progress) {
  auto start = std::chrono::steady_clock::now();
  return train::generate_text_simple(
      model, idx, max_new_tokens, context_size,
      [&](int64_t step, const std::vector<int64_t>& next) {
        if (progress) {
          progress(fmt::format("generate_text_simple: token {} of {} ({}) in {:.2f} s", step + 1,
                               max_new_tokens, fmt::join(next, ", "), seconds_since(start)));
        }
        start = std::chrono::steady_clock::now();
      });
}

namespace {

void generate_section(Notebook& nb) {
  const text::Tokenizer& tokenizer = text::Tokenizer::gpt2();
  const std::vector<int64_t> encoded = tokenizer.encode(kStartContext);
  nb.print("encoded", fmt::format("\"{}\" as GPT-2 token ids", kStartContext),
           "encoded = tokenizer.encode(start_context); print(\"encoded:\", encoded)",
           "encoded: " + python_list(encoded), encoded);
  const Tensor encoded_tensor =
      Tensor::from_int64({1, static_cast<int64_t>(encoded.size())}, encoded);
  nb.print("encoded_tensor.shape", "with a batch dimension in front",
           "encoded_tensor = torch.tensor(encoded).unsqueeze(0)",
           "encoded_tensor.shape: " + torch_size(encoded_tensor.shape()), encoded_tensor.shape());

  nn::GPTModel& model = nb.gpt_model();
  model.eval();  // disable dropout
  const Tensor out = generate_text_simple(model, encoded_tensor, kMaxNewTokens,
                                          model.config().context_length, nb.progress);
  nb.print("out", "the prompt and 6 greedily chosen tokens of the untrained model",
           "model.eval(); out = generate_text_simple(model=model, idx=encoded_tensor, "
           "max_new_tokens=6, context_size=GPT_CONFIG_124M[\"context_length\"])",
           "Output: " + nb.str(out), tensor_json(out));
  const int64_t length = out.size(1);
  nb.print("len(out[0])", "4 prompt tokens + 6 new ones", "print(\"Output length:\", len(out[0]))",
           fmt::format("Output length: {}", length), length);
  const std::vector<int64_t> ids = out.to_int64_vector();  // out.squeeze(0).tolist()
  const std::string decoded_text = tokenizer.decode(ids);
  nb.print("decoded_text", "decoded: gibberish, as the model is not trained yet",
           "decoded_text = tokenizer.decode(out.squeeze(0).tolist()); print(decoded_text)",
           decoded_text, decoded_text);
}

// ---- the sections -----------------------------------------------------------------------

using SectionFn = void (*)(Notebook&);
struct SectionEntry {
  WalkthroughSection info;
  SectionFn run;
  bool after_sci_mode_off = false;  // the notebook's sci_mode=False holds for its cells
};

const std::vector<SectionEntry>& section_table() {
  static const std::vector<SectionEntry> table = {
      {{"batch", "1. A batch of token ids",
        "two four-token texts through GPT-2's BPE tokenizer (tiktoken's \"gpt2\" encoding)"},
       batch_section},
      {{"dummy", "2. DummyGPTModel: the GPT's skeleton",
        "token + position embeddings, dropout, placeholder blocks and norm, the output layer "
        "(GPT_CONFIG_124M, torch.manual_seed(123))"},
       dummy_section},
      {{"layernorm", "3. Layer normalization",
        "(x - mean) / sqrt(var) per row: mean 0, variance 1; then the book's LayerNorm with "
        "scale, shift and eps"},
       layernorm_section},
      {{"feedforward", "4. The feed-forward network with GELU",
        "Linear(emb_dim, 4 emb_dim), GELU (tanh form), Linear(4 emb_dim, emb_dim)"},
       feedforward_section,
       true},
      {{"shortcut", "5. Shortcut connections and vanishing gradients",
        "five Linear(3, 3) + GELU layers, MSE against 0, backward: the mean |gradient| of each "
        "weight without and with x + layer(x) (torch.manual_seed(123) for each)"},
       shortcut_section,
       true},
      {{"block", "6. A transformer block",
        "x + drop(att(norm1(x))), then x + drop(ff(norm2(x))): the shape is kept "
        "(torch.manual_seed(123))"},
       block_section,
       true},
      {{"gpt", "7. GPTModel: 12 transformer blocks, GPT_CONFIG_124M",
        "vocab 50257, context 1024, emb 768, 12 heads, 12 layers, drop 0.1, no q|k|v bias; "
        "torch.manual_seed(123); its logits, parameter counts and size"},
       gpt_section,
       true},
      {{"generate", "8. Generating text: generate_text_simple",
        "greedy: append argmax softmax(logits of the last token), 6 times, from \"Hello, I am\" "
        "(the model of section 7, eval mode)"},
       generate_section,
       true},
  };
  return table;
}

const SectionEntry& find_section(const std::string& name) {
  return find_section_entry(section_table(), name, " for chapter 4");
}

}  // namespace

const std::vector<WalkthroughSection>& walkthrough_ch4_sections() {
  static const std::vector<WalkthroughSection> sections = section_infos(section_table());
  return sections;
}

void check_ch4_section(const std::string& name) { find_section(name); }

std::vector<Printed> run_walkthrough_ch4(const std::vector<std::string>& sections,
                                         const ProgressFn& progress) {
  for (const auto& name : sections) find_section(name);  // throws for an unknown name
  std::vector<Printed> printed;
  Notebook nb{&printed, progress, "", nullptr, PrintOptions{}};
  for (const auto& e : section_table()) {  // the notebook's order
    if (!sections.empty() &&
        std::find(sections.begin(), sections.end(), e.info.name) == sections.end()) {
      continue;
    }
    nb.section = e.info.name;
    nb.print_options = PrintOptions{};
    if (e.after_sci_mode_off) nb.print_options.sci_mode = false;
    e.run(nb);
  }
  return printed;
}

std::string ch4_to_text(const std::vector<Printed>& printed) {
  return printed_to_text(
      "attn walkthrough --chapter 4: the GPT chapter's notebook, GPT_CONFIG_124M under "
      "torch.manual_seed(123).\nEvery line prints as PyTorch 1.13 prints it (tensors without "
      "grad_fn); the line above it says what it is and the code it mirrors.\n",
      printed, walkthrough_ch4_sections());
}

}  // namespace attn::cli
