// walkthrough_ch5.cpp - `attn walkthrough --chapter 5`: the pretraining
// chapter's notebook, print by print, its training included.
//
// Each section follows the notebook's cells (tests/torch/oracle_walkthrough_ch5.py
// runs the same code in PyTorch). The model is GPT_CONFIG_124M with
// context_length 256 on attn's reference paths (attention, LayerNorm and GELU in
// PyTorch's float order), built under torch.manual_seed(123) and put in eval
// mode at once, as the notebook does, so nothing after it draws for dropout.
// The data loaders draw what torch's DataLoader draws on every pass
// (train::WindowLoader::start_pass), in the notebook's order.
#include "walkthrough_ch5.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "attn/generate.h"
#include "attn/gpt.h"
#include "attn/ops.h"
#include "attn/print.h"
#include "attn/random.h"
#include "attn/tokenizer.h"
#include "attn/train.h"
#include "attn/train_book.h"
#include "attn/utf8.h"
#include "walkthrough_ch4.h"

namespace attn::cli {
namespace {

constexpr uint64_t kBookSeed = 123;  // the notebook's torch.manual_seed(123)
constexpr int64_t kContextLength = 256;  // the chapter's GPT_CONFIG_124M["context_length"]
const char* const kStartContext = "Every effort moves you";
constexpr int64_t kMaxNewTokens = 10;
// The loss example: "every effort moves" / "I really like" and their next tokens.
const char* const kInputs[2] = {"every effort moves", "I really like"};
const char* const kTargets[2] = {" effort moves you", " really like chocolate"};
constexpr double kTrainRatio = 0.90;
constexpr int64_t kBatchSize = 2;
constexpr size_t kPreviewChars = 99;  // text_data[:99], text_data[-99:]

std::string torch_size(const Shape& shape) {
  return fmt::format("torch.Size([{}])", fmt::join(shape, ", "));
}

// Python's repr of a float: the shortest digits that read back, with ".0" for
// whole numbers (fmt's shortest form otherwise agrees for these magnitudes).
std::string python_float(double v) {
  std::string s = fmt::format("{}", v);
  if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

nlohmann::json tensor_json(const Tensor& t) {
  nlohmann::json values = nlohmann::json::array();
  if (t.dtype() == DType::kInt64) {
    for (int64_t v : t.to_int64_vector()) values.push_back(v);
  } else {
    for (float v : t.to_vector()) {
      if (std::isfinite(v)) {
        values.push_back(v);
      } else {  // JSON has no inf or nan: Python's repr as a string
        values.push_back(std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf");
      }
    }
  }
  return {{"shape", t.shape()}, {"values", std::move(values)}};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw std::runtime_error(fmt::format(
        "cannot read '{}' (the notebook's the-verdict.txt; give its path with --text FILE)",
        printable(path)));
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// text[first, first + count) by code points, as Python slices a str.
std::string code_point_slice(const std::vector<char32_t>& cps, size_t first, size_t count) {
  std::string out;
  for (size_t i = first; i < first + count && i < cps.size(); ++i) out += encode_utf8(cps[i]);
  return out;
}

struct Notebook {
  std::vector<Printed>* out = nullptr;
  ProgressFn progress;
  std::function<void(int64_t, int64_t, float)> on_train_step;
  std::string text_path;
  std::string section;
  std::unique_ptr<nn::GPTModel> model;
  std::string text_data;  // the-verdict.txt, read once
  int64_t num_epochs = 10;  // the training cell's num_epochs
  // The training cell's model, trained (by the train section, or first by a
  // section that needs it), and its history.
  std::unique_ptr<train::Trainer> trainer;
  train::BookHistory history;

  void print(std::string name, const std::string& what, const std::string& code, std::string text,
             nlohmann::json value) {
    out->push_back(Printed{section, std::move(name), fmt::format("{}: {}", what, code),
                           std::move(text), std::move(value)});
  }
  void say(const std::string& line) const {
    if (progress) progress(line);
  }

  // torch.manual_seed(123); model = GPTModel(GPT_CONFIG_124M); model.eval()
  nn::GPTModel& gpt_model() {
    if (!model) {
      const auto start = std::chrono::steady_clock::now();
      say("GPTModel(GPT_CONFIG_124M, context_length 256) under torch.manual_seed(123): drawing "
          "its weights ...");
      manual_seed(kBookSeed);
      nn::GPTConfig cfg = nn::GPT_CONFIG_124M;
      cfg.context_length = kContextLength;
      model = std::make_unique<nn::GPTModel>(
          cfg, nn::GPTOptions{.attention_backend = nn::AttentionBackend::kReference,
                              .exact_dropout = true,
                              .layers = nn::LayerImpl::kReference});
      model->eval();  // the notebook's model.eval() right after building it
      say(fmt::format("GPTModel: {} parameters in {:.1f} s", model->num_parameters(),
                      seconds_since(start)));
    }
    return *model;
  }

  const std::string& verdict() {
    if (text_data.empty()) text_data = read_text_file(text_path);
    return text_data;
  }
};

// text_to_token_ids: tokenizer.encode(text, allowed_special={"<|endoftext|>"}), (1, n).
Tensor text_to_token_ids(const std::string& text) {
  const std::vector<int64_t> ids = text::Tokenizer::gpt2().encode(text, /*allow_special=*/true);
  return Tensor::from_int64({1, static_cast<int64_t>(ids.size())}, ids);
}

// token_ids_to_text: tokenizer.decode(token_ids.squeeze(0).tolist()), bytes
// that are not UTF-8 as tiktoken's errors="replace" gives them.
std::string token_ids_to_text(const Tensor& ids) {
  return utf8_replacing_invalid(text::Tokenizer::gpt2().decode(ids.to_int64_vector()));
}

// ---- 1. generating text with the untrained model ------------------------------------------

void generate_section(Notebook& nb) {
  nn::GPTModel& model = nb.gpt_model();
  const Tensor token_ids = generate_text_simple(model, text_to_token_ids(kStartContext),
                                                kMaxNewTokens, kContextLength, nb.progress);
  const std::string text = token_ids_to_text(token_ids);
  nb.print("token_ids_to_text(token_ids, tokenizer)",
           fmt::format("\"{}\" and 10 greedily chosen tokens of the untrained model "
                       "(GPT_CONFIG_124M, context_length 256, torch.manual_seed(123), eval mode)",
                       kStartContext),
           "token_ids = generate_text_simple(model=model, idx=text_to_token_ids(start_context, "
           "tokenizer), max_new_tokens=10, context_size=GPT_CONFIG_124M[\"context_length\"]); "
           "print(\"Output text:\\n\", token_ids_to_text(token_ids, tokenizer))",
           "Output text:\n " + text, text);
}

// ---- 2. the loss of two examples -------------------------------------------------------

// The two texts as a (2, n) batch of GPT-2 ids (the notebook writes the ids out).
Tensor id_batch(const char* const (&texts)[2]) {
  const text::Tokenizer& tokenizer = text::Tokenizer::gpt2();
  const std::vector<int64_t> a = tokenizer.encode(texts[0]);
  const std::vector<int64_t> b = tokenizer.encode(texts[1]);
  if (a.size() != b.size()) {
    throw std::logic_error(fmt::format("walkthrough: '{}' is {} tokens but '{}' is {}", texts[0],
                                       a.size(), texts[1], b.size()));
  }
  std::vector<int64_t> ids = a;
  ids.insert(ids.end(), b.begin(), b.end());
  return Tensor::from_int64({2, static_cast<int64_t>(a.size())}, ids);
}

void loss_section(Notebook& nb) {
  const Tensor inputs = id_batch(kInputs);    // (2, 3)
  const Tensor targets = id_batch(kTargets);  // (2, 3)
  nn::GPTModel& model = nb.gpt_model();
  const Tensor logits = model.forward(inputs);  // (2, 3, V)
  const Tensor probas = softmax(logits, -1);
  const int64_t B = probas.size(0), T = probas.size(1), V = probas.size(2);
  nb.print("probas.shape",
           fmt::format("softmax over the vocabulary of the logits of \"{}\" and \"{}\"", kInputs[0],
                       kInputs[1]),
           "inputs = torch.tensor([[16833, 3626, 6100], [40, 1107, 588]]); logits = model(inputs); "
           "probas = torch.softmax(logits, dim=-1); print(probas.shape)",
           torch_size(probas.shape()), probas.shape());

  // torch.argmax(probas, dim=-1, keepdim=True): the first maximum.
  const std::vector<float> p = probas.to_vector();
  std::vector<int64_t> arg(static_cast<size_t>(B * T));
  for (int64_t r = 0; r < B * T; ++r) {
    const auto first = p.begin() + r * V;
    arg[static_cast<size_t>(r)] = std::max_element(first, first + V) - first;
  }
  const Tensor token_ids = Tensor::from_int64({B, T, 1}, arg);
  nb.print("token_ids", "the most likely next token at each position",
           "token_ids = torch.argmax(probas, dim=-1, keepdim=True); "
           "print(\"Token IDs:\\n\", token_ids)",
           "Token IDs:\n " + to_string(token_ids), tensor_json(token_ids));
  const std::string target_text = token_ids_to_text(select(targets, 0, 0));
  nb.print("targets[0]", "what the first text should continue with",
           "print(f\"Targets batch 1: {token_ids_to_text(targets[0], tokenizer)}\")",
           "Targets batch 1: " + target_text, target_text);
  const std::string output_text = token_ids_to_text(select(token_ids, 0, 0).reshape({T}));
  nb.print("token_ids[0].flatten()", "and what the untrained model predicts instead",
           "print(f\"Outputs batch 1: {token_ids_to_text(token_ids[0].flatten(), tokenizer)}\")",
           "Outputs batch 1: " + output_text, output_text);

  // probas[text_idx, [0, 1, 2], targets[text_idx]]
  const std::vector<int64_t> tgt = targets.to_int64_vector();
  std::vector<float> target_probas[2];
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      target_probas[b].push_back(
          p[static_cast<size_t>((b * T + t) * V + tgt[static_cast<size_t>(b * T + t)])]);
    }
    const Tensor tp = Tensor({T}, target_probas[b]);
    nb.print(fmt::format("target_probas_{}", b + 1),
             fmt::format("the probabilities the model gives text {}'s target tokens", b + 1),
             fmt::format("text_idx = {}; target_probas_{} = probas[text_idx, [0, 1, 2], "
                         "targets[text_idx]]; print(\"Text {}:\", target_probas_{})",
                         b, b + 1, b + 1, b + 1),
             fmt::format("Text {}: {}", b + 1, to_string(tp)), tensor_json(tp));
  }
  std::vector<float> cat = target_probas[0];
  cat.insert(cat.end(), target_probas[1].begin(), target_probas[1].end());
  Tensor log_probas = Tensor({B * T}, cat);
  for (float& v : log_probas.values()) v = std::log(v);
  nb.print("log_probas", "their logarithms",
           "log_probas = torch.log(torch.cat((target_probas_1, target_probas_2))); "
           "print(log_probas)",
           to_string(log_probas), tensor_json(log_probas));
  const Tensor avg_log_probas = mean(log_probas, 0);
  nb.print("avg_log_probas", "averaged (training pushes this towards 0)",
           "avg_log_probas = torch.mean(log_probas); print(avg_log_probas)",
           to_string(avg_log_probas), tensor_json(avg_log_probas));
  const Tensor neg_avg_log_probas = mul(avg_log_probas, -1.0f);
  nb.print("neg_avg_log_probas", "negated: the cross entropy, to be minimised",
           "neg_avg_log_probas = avg_log_probas * -1; print(neg_avg_log_probas)",
           to_string(neg_avg_log_probas), tensor_json(neg_avg_log_probas));

  nb.print("logits.shape", "the logits are (batch_size, num_tokens, vocab_size)",
           "print(\"Logits shape:\", logits.shape)", "Logits shape: " + torch_size(logits.shape()),
           logits.shape());
  nb.print("targets.shape", "the targets (batch_size, num_tokens)",
           "print(\"Targets shape:\", targets.shape)",
           "Targets shape: " + torch_size(targets.shape()), targets.shape());
  const Shape logits_flat{B * T, V};
  const Shape targets_flat{B * T};
  nb.print("logits_flat.shape", "cross_entropy takes the batch flattened: (B x T, V)",
           "logits_flat = logits.flatten(0, 1); print(\"Flattened logits:\", logits_flat.shape)",
           "Flattened logits: " + torch_size(logits_flat), logits_flat);
  nb.print("targets_flat.shape", "and (B x T) targets",
           "targets_flat = targets.flatten(); print(\"Flattened targets:\", targets_flat.shape)",
           "Flattened targets: " + torch_size(targets_flat), targets_flat);
  nn::CrossEntropyLoss ce;
  const float loss = ce.forward(logits, targets);
  const Tensor loss_t = Tensor(Shape{}, std::vector<float>{loss});
  nb.print("loss", "PyTorch's cross entropy: the same negative average log probability",
           "loss = torch.nn.functional.cross_entropy(logits_flat, targets_flat); print(loss)",
           to_string(loss_t), tensor_json(loss_t));
  const Tensor perplexity = exp(loss_t);
  nb.print("perplexity",
           "perplexity, exp(loss): about how many tokens the model is unsure between",
           "perplexity = torch.exp(loss); print(perplexity)", to_string(perplexity),
           tensor_json(perplexity));
}

// ---- 3. The Verdict -----------------------------------------------------------------------

void data_section(Notebook& nb) {
  const std::string& text_data = nb.verdict();
  const std::vector<char32_t> cps = decode_utf8(text_data);
  const std::string head = code_point_slice(cps, 0, kPreviewChars);
  const std::string tail =
      code_point_slice(cps, cps.size() - std::min(cps.size(), kPreviewChars), kPreviewChars);
  nb.print("text_data[:99]", "the short story the chapter trains on: its first 99 characters",
           "with open(\"the-verdict.txt\", \"r\", encoding=\"utf-8\") as file: text_data = "
           "file.read(); print(text_data[:99])",
           head, head);
  nb.print("text_data[-99:]", "its last 99 characters", "print(text_data[-99:])", tail, tail);
  const auto characters = static_cast<int64_t>(cps.size());
  const auto tokens = static_cast<int64_t>(text::Tokenizer::gpt2().encode(text_data).size());
  nb.print("total_characters", "its length in characters",
           "total_characters = len(text_data); print(\"Characters:\", total_characters)",
           fmt::format("Characters: {}", characters), characters);
  nb.print("total_tokens", "and in GPT-2 tokens",
           "total_tokens = len(tokenizer.encode(text_data)); print(\"Tokens:\", total_tokens)",
           fmt::format("Tokens: {}", tokens), tokens);
}

// ---- 4. the loaders -----------------------------------------------------------------------

struct Loaders {
  train::WindowLoader train_loader, val_loader;
};

// train_ratio = 0.90; split_idx = int(train_ratio * len(text_data)) characters;
// create_dataloader_v1 of each part (batch 2, max_length = stride = 256; train:
// shuffle, drop_last; validation: neither). Building them draws nothing.
Loaders make_loaders(Notebook& nb) {
  const std::string& text_data = nb.verdict();
  const std::vector<char32_t> cps = decode_utf8(text_data);
  const auto split_idx = static_cast<size_t>(kTrainRatio * static_cast<double>(cps.size()));
  const std::string train_data = code_point_slice(cps, 0, split_idx);
  const std::string val_data = code_point_slice(cps, split_idx, cps.size() - split_idx);
  const text::Tokenizer& tokenizer = text::Tokenizer::gpt2();
  return Loaders{
      train::WindowLoader(tokenizer.encode(train_data, true), kBatchSize, kContextLength,
                          kContextLength, /*shuffle=*/true, /*drop_last=*/true, "train"),
      train::WindowLoader(tokenizer.encode(val_data, true), kBatchSize, kContextLength,
                          kContextLength, /*shuffle=*/false, /*drop_last=*/false, "validation")};
}

void loaders_section(Notebook& nb) {
  manual_seed(kBookSeed);  // the notebook's, before creating the loaders
  Loaders l = make_loaders(nb);
  Generator& gen = default_generator();
  const auto print_pass = [&nb, &gen](train::WindowLoader& loader, const std::string& header,
                                      const std::string& header_code, const std::string& what) {
    nb.print(header_code, what, fmt::format("print(\"{}\")", header_code), header, header);
    loader.start_pass(gen);
    while (loader.in_pass()) {
      const auto [x, y] = loader.next();
      nb.print("x.shape, y.shape", "one batch: inputs and targets (batch_size, max_length)",
               "for x, y in loader: print(x.shape, y.shape)",
               torch_size(x.shape()) + " " + torch_size(y.shape()),
               nlohmann::json::array({x.shape(), y.shape()}));
    }
  };
  print_pass(l.train_loader, "Train loader:", "Train loader:",
             "the training loader's batches (90% of the text, shuffled, drop_last=True)");
  print_pass(l.val_loader, "\nValidation loader:", "\\nValidation loader:",
             "the validation loader's (the last 10%, in order)");

  const auto count = [&gen](train::WindowLoader& loader) {
    int64_t tokens = 0;
    loader.start_pass(gen);
    while (loader.in_pass()) tokens += loader.next().first.numel();
    return tokens;
  };
  const int64_t train_tokens = count(l.train_loader);
  const int64_t val_tokens = count(l.val_loader);
  nb.print("train_tokens", "the input tokens of a training pass",
           "for input_batch, target_batch in train_loader: train_tokens += input_batch.numel(); "
           "print(\"Training tokens:\", train_tokens)",
           fmt::format("Training tokens: {}", train_tokens), train_tokens);
  nb.print("val_tokens", "of a validation pass",
           "for input_batch, target_batch in val_loader: val_tokens += input_batch.numel(); "
           "print(\"Validation tokens:\", val_tokens)",
           fmt::format("Validation tokens: {}", val_tokens), val_tokens);
  nb.print("train_tokens + val_tokens", "together",
           "print(\"All tokens:\", train_tokens + val_tokens)",
           fmt::format("All tokens: {}", train_tokens + val_tokens), train_tokens + val_tokens);
}

// ---- 5. the untrained model's loss on the loaders ------------------------------------------

// calc_loss_loader(data_loader, model): a pass over every batch, the mean of
// calc_loss_batch's cross entropies as Python floats (summed in double).
double calc_loss_loader(train::WindowLoader& loader, nn::GPTModel& model, const Notebook& nb) {
  loader.start_pass(default_generator());
  const int64_t num_batches = loader.batches();
  double total_loss = 0.0;
  int64_t i = 0;
  while (loader.in_pass()) {
    const auto start = std::chrono::steady_clock::now();
    const auto [input_batch, target_batch] = loader.next();
    nn::CrossEntropyLoss ce;
    const float loss = ce.forward(model.forward(input_batch), target_batch);
    total_loss += static_cast<double>(loss);  // loss.item()
    ++i;
    nb.say(fmt::format("calc_loss_loader: batch {} of {}: loss {} in {:.2f} s", i, num_batches,
                       python_float(loss), seconds_since(start)));
  }
  return total_loss / static_cast<double>(num_batches);
}

void loader_loss_section(Notebook& nb) {
  Loaders l = make_loaders(nb);
  nn::GPTModel& model = nb.gpt_model();
  manual_seed(kBookSeed);  // "for reproducibility due to the shuffling in the data loader"
  const double train_loss = calc_loss_loader(l.train_loader, model, nb);
  const double val_loss = calc_loss_loader(l.val_loader, model, nb);
  nb.print("train_loss",
           "the untrained model's mean cross entropy over the training batches (about ln 50257 "
           "= 10.8: near-uniform guesses)",
           "torch.manual_seed(123); train_loss = calc_loss_loader(train_loader, model, device); "
           "print(\"Training loss:\", train_loss)",
           "Training loss: " + python_float(train_loss), train_loss);
  nb.print("val_loss", "and over the validation batches",
           "val_loss = calc_loss_loader(val_loader, model, device); "
           "print(\"Validation loss:\", val_loss)",
           "Validation loss: " + python_float(val_loss), val_loss);
}

// ---- 6. training: train_model_simple -------------------------------------------------------

// The training cell: torch.manual_seed(123); model = GPTModel(GPT_CONFIG_124M)
// (a new model, in train mode); AdamW(model.parameters(), lr=0.0004,
// weight_decay=0.1); train_model_simple(num_epochs=10, eval_freq=5,
// eval_iter=5, start_context="Every effort moves you"). attn::train's book
// recipe on The Verdict is the same run: one generator seeded 123 draws the
// weights, then every loader pass and dropout mask, as torch's global one does
// (the loaders and their split are the notebook's: the Trainer tokenizes the
// same 90/10 split by characters).
train::Trainer& trained(Notebook& nb) {
  if (nb.trainer) return *nb.trainer;
  nb.model.reset();  // the untrained model of the sections before (500 MB) is not used again
  train::TrainOptions options = train::book_ch5_options();
  options.epochs = nb.num_epochs;
  const auto start = std::chrono::steady_clock::now();
  nb.say("training cell: torch.manual_seed(123); GPTModel(GPT_CONFIG_124M, context_length 256); "
         "AdamW(lr=0.0004, weight_decay=0.1) ...");
  nb.trainer = std::make_unique<train::Trainer>(nb.verdict(), options);
  const int64_t steps = options.epochs * nb.trainer->train_loader()->batches();
  nb.say(fmt::format("train_model_simple: {} epochs of {} steps on the reference path "
                     "(PyTorch's dropout masks), evaluation every 5 steps",
                     options.epochs, nb.trainer->train_loader()->batches()));
  train::BookCallbacks cb;
  cb.on_step = [&nb, steps](int64_t step, float loss, double ms) {
    if (nb.on_train_step) {
      nb.on_train_step(step + 1, steps, loss);
    } else {
      nb.say(fmt::format("train_model_simple: step {} of {}: loss {} in {:.2f} s", step + 1, steps,
                         python_float(loss), ms * 1e-3));
    }
  };
  cb.on_evaluation = [&nb](const train::BookEvaluation& e) {
    nb.say(train::format_evaluation(e));
  };
  cb.on_sample = [&nb](const train::BookSample& s) {
    nb.say(fmt::format("epoch {} sample: {}", s.epoch, s.text));
  };
  nb.history = train::train_model_simple(*nb.trainer, cb);
  nb.say(fmt::format("train_model_simple: {} epochs in {:.1f} s", options.epochs,
                     seconds_since(start)));
  return *nb.trainer;
}

void train_section(Notebook& nb) {
  trained(nb);
  // The prints in train_model_simple's order: each epoch's evaluations, then its sample.
  size_t k = 0;
  for (const train::BookSample& s : nb.history.samples) {
    for (; k < nb.history.evaluations.size() && nb.history.evaluations[k].epoch <= s.epoch; ++k) {
      const train::BookEvaluation& e = nb.history.evaluations[k];
      nb.print("train_model_simple: evaluate_model",
               fmt::format("after step {} ({} tokens seen): the mean loss of the first 5 "
                           "training and the first 5 validation batches, in eval mode",
                           e.global_step, e.tokens_seen),
               "print(f\"Ep {epoch+1} (Step {global_step:06d}): Train loss {train_loss:.3f}, "
               "Val loss {val_loss:.3f}\")",
               train::format_evaluation(e),
               {{"epoch", e.epoch},
                {"global_step", e.global_step},
                {"train_loss", e.train_loss},
                {"val_loss", e.val_loss},
                {"tokens_seen", e.tokens_seen}});
    }
    nb.print("train_model_simple: generate_and_print_sample",
             fmt::format("the end of epoch {}: 50 greedy tokens from \"{}\" (newlines printed "
                         "as spaces)",
                         s.epoch, kStartContext),
             "generate_and_print_sample(model, tokenizer, device, start_context): "
             "print(decoded_text.replace(\"\\n\", \" \"))",
             s.text, {{"epoch", s.epoch}, {"ids", s.ids}, {"text", s.text}});
  }
}

// ---- 7. the trained model's greedy text ----------------------------------------------------

constexpr int64_t kTrainedNewTokens = 25;

void trained_generate_section(Notebook& nb) {
  nn::GPTModel& model = trained(nb).model();
  model.eval();
  const Tensor token_ids = train::generate_text_simple(
      model, text_to_token_ids(kStartContext), kTrainedNewTokens, kContextLength);
  const std::string text = token_ids_to_text(token_ids);
  nb.print("token_ids_to_text(token_ids, tokenizer)",
           fmt::format("the trained model: \"{}\" and 25 greedily chosen tokens (the same "
                       "passages of The Verdict again and again: it has memorised the text)",
                       kStartContext),
           "model.eval(); token_ids = generate_text_simple(model=model, "
           "idx=text_to_token_ids(\"Every effort moves you\", tokenizer), max_new_tokens=25, "
           "context_size=GPT_CONFIG_124M[\"context_length\"]); print(\"Output text:\\n\", "
           "token_ids_to_text(token_ids, tokenizer))",
           "Output text:\n " + text,
           {{"ids", token_ids.to_int64_vector()}, {"text", text}});
}

// ---- 8. decoding strategies: temperature and top-k on a 9-word vocabulary ------------------

// The notebook's vocab, in id order, and its fixed next_token_logits.
const char* const kVocab[] = {"closer", "every", "effort", "forward", "inches",
                              "moves",  "pizza", "toward", "you"};
constexpr int64_t kVocabSize = 9;
const std::vector<float> kNextTokenLogits = {4.51f, 0.89f,  -1.90f, 6.75f, 1.63f,
                                             -1.62f, -1.89f, 6.28f, 1.79f};
constexpr int64_t kDraws = 1000;
constexpr int64_t kTopK = 3;

// torch.softmax(logits / temperature, dim=0) of the 9 logits.
Tensor softmax_with_temperature(float temperature) {
  return softmax(div(Tensor({kVocabSize}, kNextTokenLogits), temperature), 0);
}

// torch.multinomial(probas, num_samples=1).item() for probas = softmax(logits / T):
// sample_next draws as torch.multinomial does (one row, one sample).
int64_t multinomial_one(float temperature) {
  return nn::sample_next(Tensor({1, kVocabSize}, kNextTokenLogits), temperature, /*top_k=*/0,
                         default_generator())[0];
}

// The notebook's print_sampled_tokens(probas): torch.manual_seed(123), 1,000
// draws, torch.bincount (ids up to the largest drawn), "{freq} x {word}" each.
void print_sampled_tokens(Notebook& nb, float temperature, const std::string& probas_name) {
  manual_seed(kBookSeed);
  std::vector<int64_t> counts;
  for (int64_t i = 0; i < kDraws; ++i) {
    const int64_t id = multinomial_one(temperature);
    if (id >= static_cast<int64_t>(counts.size())) counts.resize(static_cast<size_t>(id) + 1, 0);
    ++counts[static_cast<size_t>(id)];
  }
  for (size_t i = 0; i < counts.size(); ++i) {
    nb.print(fmt::format("sampled_ids[{}]", i),
             fmt::format("how often \"{}\" came out of 1,000 draws", kVocab[i]),
             fmt::format("print_sampled_tokens({}): torch.manual_seed(123); sample = "
                         "[torch.multinomial(probas, num_samples=1).item() for i in "
                         "range(1_000)]; sampled_ids = torch.bincount(torch.tensor(sample))",
                         probas_name),
             fmt::format("{} x {}", counts[i], kVocab[i]), counts[i]);
  }
}

void decoding_section(Notebook& nb) {
  const Tensor probas = softmax_with_temperature(1.0f);
  const std::vector<float> p = probas.to_vector();
  const int64_t next_token_id = std::max_element(p.begin(), p.end()) - p.begin();
  nb.print("inverse_vocab[next_token_id]",
           "greedy decoding picks the most likely of the 9 words",
           "probas = torch.softmax(next_token_logits, dim=0); next_token_id = "
           "torch.argmax(probas).item(); print(inverse_vocab[next_token_id])",
           kVocab[next_token_id], kVocab[next_token_id]);
  manual_seed(kBookSeed);
  const int64_t sampled = multinomial_one(1.0f);
  nb.print("inverse_vocab[next_token_id]", "sampling draws one in proportion to its probability",
           "torch.manual_seed(123); next_token_id = torch.multinomial(probas, "
           "num_samples=1).item(); print(inverse_vocab[next_token_id])",
           kVocab[sampled], kVocab[sampled]);
  print_sampled_tokens(nb, 1.0f, "probas");

  const float temperatures[] = {1.0f, 0.1f, 5.0f};
  const char* const temperature_repr[] = {"1", "0.1", "5"};  // the Python list [1, 0.1, 5]
  for (size_t i = 0; i < 3; ++i) {
    nb.print("temperatures[i]",
             i == 0   ? "temperature 1: the probabilities unchanged"
             : i == 1 ? "temperature 0.1: sharper, nearly greedy"
                      : "temperature 5: flatter, every word drawn now and then",
             "scaled_probas = [softmax_with_temperature(next_token_logits, T) for T in "
             "temperatures]; for i, probas in enumerate(scaled_probas): "
             "print(\"\\n\\nTemperature:\", temperatures[i]); print_sampled_tokens(probas)",
             fmt::format("\n\nTemperature: {}", temperature_repr[i]),
             nlohmann::json::parse(temperature_repr[i]));
    print_sampled_tokens(nb, temperatures[i], "scaled_probas[" + std::to_string(i) + "]");
  }

  // torch.topk(next_token_logits, 3): the largest first (distinct here).
  std::vector<int64_t> order(static_cast<size_t>(kVocabSize));
  for (int64_t i = 0; i < kVocabSize; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [](int64_t a, int64_t b) {
    return kNextTokenLogits[static_cast<size_t>(a)] > kNextTokenLogits[static_cast<size_t>(b)];
  });
  std::vector<float> top_values;
  std::vector<int64_t> top_pos(order.begin(), order.begin() + kTopK);
  for (int64_t id : top_pos) top_values.push_back(kNextTokenLogits[static_cast<size_t>(id)]);
  const Tensor top_logits({kTopK}, top_values);
  const Tensor top_positions = Tensor::from_int64({kTopK}, top_pos);
  nb.print("top_logits", "top-k with k = 3: the three largest logits",
           "top_k = 3; top_logits, top_pos = torch.topk(next_token_logits, top_k); "
           "print(\"Top logits:\", top_logits)",
           "Top logits: " + to_string(top_logits), tensor_json(top_logits));
  nb.print("top_pos", "and their token ids", "print(\"Top positions:\", top_pos)",
           "Top positions: " + to_string(top_positions), tensor_json(top_positions));
  std::vector<float> masked = kNextTokenLogits;
  for (float& v : masked) {
    if (v < top_values.back()) v = -std::numeric_limits<float>::infinity();
  }
  const Tensor new_logits({kVocabSize}, masked);
  nb.print("new_logits", "every logit below the third largest becomes -inf",
           "new_logits = torch.where(condition=next_token_logits < top_logits[-1], "
           "input=torch.tensor(float(\"-inf\")), other=next_token_logits); print(new_logits)",
           to_string(new_logits), tensor_json(new_logits));
  const Tensor topk_probas = softmax(new_logits, 0);
  nb.print("topk_probas", "so softmax gives the other words probability 0",
           "topk_probas = torch.softmax(new_logits, dim=0); print(topk_probas)",
           to_string(topk_probas), tensor_json(topk_probas));
}

// ---- 9. generate with top-k and temperature -----------------------------------------------

constexpr int64_t kTopKNewTokens = 15;
constexpr int64_t kGenerateTopK = 25;
constexpr float kGenerateTemperature = 1.4f;

// The chapter's generate: the top 25 logits kept (the rest -inf), divided by
// the temperature 1.4, softmax, one torch.multinomial draw per token
// (nn::generate without a cache: the full forward of the prefix each step, as
// the book runs it), under torch.manual_seed(123).
void top_k_generate_section(Notebook& nb) {
  nn::GPTModel& model = trained(nb).model();
  model.eval();
  manual_seed(kBookSeed);
  const Tensor token_ids = nn::generate(model, text_to_token_ids(kStartContext),
                                        nn::GenerateOptions{.max_new_tokens = kTopKNewTokens,
                                                            .temperature = kGenerateTemperature,
                                                            .top_k = kGenerateTopK,
                                                            .use_cache = false},
                                        default_generator());
  const std::string text = token_ids_to_text(token_ids);
  nb.print("token_ids_to_text(token_ids, tokenizer)",
           "the trained model with top-k 25 and temperature 1.4: 15 tokens drawn, not chosen "
           "greedily (new text, less memorised)",
           "torch.manual_seed(123); token_ids = generate(model=model, "
           "idx=text_to_token_ids(\"Every effort moves you\", tokenizer), max_new_tokens=15, "
           "context_size=GPT_CONFIG_124M[\"context_length\"], top_k=25, temperature=1.4); "
           "print(\"Output text:\\n\", token_ids_to_text(token_ids, tokenizer))",
           "Output text:\n " + text,
           {{"ids", token_ids.to_int64_vector()}, {"text", text}});
}

// ---- the sections -----------------------------------------------------------------------

using SectionFn = void (*)(Notebook&);
struct SectionEntry {
  WalkthroughSection info;
  SectionFn run;
};

const std::vector<SectionEntry>& section_table() {
  static const std::vector<SectionEntry> table = {
      {{"generate", "1. Generating text with the untrained model",
        "GPT_CONFIG_124M with context_length 256, torch.manual_seed(123), model.eval(); "
        "generate_text_simple, 10 tokens from \"Every effort moves you\""},
       generate_section},
      {{"loss", "2. The text generation loss: cross entropy and perplexity",
        "two 3-token inputs and their targets: the probabilities of the targets, their "
        "negative average log, torch.nn.functional.cross_entropy and exp(loss)"},
       loss_section},
      {{"data", "3. The Verdict: the training text",
        "the-verdict.txt: its first and last 99 characters, its length in characters and in "
        "GPT-2 tokens"},
       data_section},
      {{"loaders", "4. Training and validation loaders",
        "90/10 split by characters, create_dataloader_v1 (batch 2, max_length = stride = 256) "
        "after torch.manual_seed(123); each pass's batch shapes and token counts"},
       loaders_section},
      {{"loader_loss", "5. The untrained model's loss on both loaders",
        "calc_loss_batch and calc_loss_loader under torch.manual_seed(123): the mean cross "
        "entropy of every training and every validation batch"},
       loader_loss_section},
      {{"train", "6. Training the model: train_model_simple",
        "torch.manual_seed(123), a new GPTModel, AdamW(lr=0.0004, weight_decay=0.1); 10 epochs "
        "over the training loader, evaluation every 5 steps on 5 batches, a greedy sample after "
        "each epoch (minutes: the reference path, PyTorch's dropout masks; progress on stderr)"},
       train_section},
      {{"trained_generate", "7. The trained model's text",
        "model.eval(); generate_text_simple, 25 tokens from \"Every effort moves you\" (trains "
        "first when the train section did not run)"},
       trained_generate_section},
      {{"decoding", "8. Decoding strategies: temperature scaling and top-k",
        "the 9-word vocabulary and its fixed next_token_logits: argmax, torch.multinomial "
        "under torch.manual_seed(123), print_sampled_tokens (1,000 draws) at temperatures 1, "
        "0.1 and 5, torch.topk and the -inf mask (the notebook's cells after the training)"},
       decoding_section},
      {{"top_k_generate", "9. Temperature and top-k with the trained model",
        "the chapter's generate(top_k=25, temperature=1.4), 15 tokens under "
        "torch.manual_seed(123) (trains first when the train section did not run)"},
       top_k_generate_section},
  };
  return table;
}

const SectionEntry& find_section(const std::string& name) {
  return find_section_entry(section_table(), name, " for chapter 5");
}

}  // namespace

const std::vector<WalkthroughSection>& walkthrough_ch5_sections() {
  static const std::vector<WalkthroughSection> sections = section_infos(section_table());
  return sections;
}

void check_ch5_section(const std::string& name) { find_section(name); }

std::vector<Printed> run_walkthrough_ch5(const std::vector<std::string>& sections,
                                         const Ch5Options& options,
                                         const ProgressFn& progress) {
  for (const auto& name : sections) find_section(name);  // throws for an unknown name
  if (options.num_epochs < 1)
    throw std::invalid_argument(
        fmt::format("--epochs must be >= 1 (the notebook trains 10), got {}", options.num_epochs));
  std::vector<Printed> printed;
  Notebook nb;
  nb.out = &printed;
  nb.progress = progress;
  nb.on_train_step = options.on_train_step;
  nb.text_path = options.text_path;
  nb.num_epochs = options.num_epochs;
  for (const auto& e : section_table()) {  // the notebook's order
    if (!sections.empty() &&
        std::find(sections.begin(), sections.end(), e.info.name) == sections.end()) {
      continue;
    }
    nb.section = e.info.name;
    e.run(nb);
  }
  return printed;
}

std::string ch5_to_text(const std::vector<Printed>& printed) {
  return printed_to_text(
      "attn walkthrough --chapter 5: the pretraining chapter's notebook, GPT_CONFIG_124M "
      "(context_length 256) under torch.manual_seed(123), trained on The Verdict.\nEvery line prints as "
      "PyTorch 1.13 prints it; the line above it says what it is and the code it mirrors.\n",
      printed, walkthrough_ch5_sections());
}

}  // namespace attn::cli
