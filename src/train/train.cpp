// Training a GPT, or a Llama / Qwen / Gemma decoder, on characters, GPT-2's BPE or a
// tokenizer.json (attn/train.h).
#include "attn/train.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "attn/fnv1a.h"
#include "attn/model_config.h"
#include "attn/read_file.h"
#include "attn/safetensors.h"
#include "attn/token_shards.h"
#include "attn/tokenizer.h"
#include "attn/utf8.h"

namespace attn::train {

using nlohmann::json;

// ---- the generator as JSON, metadata -------------------------------------------------------

namespace {

std::string generator_to_json(const GeneratorState& s) {
  nlohmann::ordered_json j;
  j["seed"] = s.seed;
  j["left"] = s.left;
  j["next"] = s.next;
  j["mt"] = s.mt;
  if (s.cached_normal) j["cached_normal"] = *s.cached_normal;  // doubles round-trip in JSON
  return j.dump();
}

GeneratorState generator_from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    GeneratorState s;
    s.seed = j.at("seed").get<uint64_t>();
    s.left = j.at("left").get<int>();
    s.next = j.at("next").get<int>();
    const auto mt = j.at("mt").get<std::vector<uint32_t>>();
    if (mt.size() != s.mt.size())
      throw std::invalid_argument(fmt::format("generator: mt has {} words, expected {}", mt.size(), s.mt.size()));
    std::copy(mt.begin(), mt.end(), s.mt.begin());
    if (j.contains("cached_normal")) s.cached_normal = j.at("cached_normal").get<double>();
    return s;
  } catch (const json::exception& e) {
    throw std::invalid_argument(fmt::format("generator: {}", e.what()));
  }
}

const std::string& meta(const std::map<std::string, std::string>& m, const std::string& key,
                        const std::string& path) {
  const auto it = m.find(key);
  if (it == m.end())
    throw std::invalid_argument(fmt::format("checkpoint '{}' has no metadata \"{}\"", printable(path), printable(key)));
  return it->second;
}

// A count from the metadata, at least `min` (-1 only for last_eval_iter: none yet).
int64_t meta_int(const std::map<std::string, std::string>& m, const std::string& key,
                 const std::string& path, int64_t min = 0) {
  const std::string& v = meta(m, key, path);
  try {
    size_t used = 0;
    const int64_t x = std::stoll(v, &used);
    if (used == v.size() && x >= min && !v.empty() &&
        (v[0] == '-' || std::isdigit(static_cast<unsigned char>(v[0]))))
      return x;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(
      fmt::format("checkpoint '{}': metadata \"{}\" = \"{}\" is not an iteration count",
                  printable(path), printable(key), printable(v)));
}

}  // namespace

// ---- Trainer -------------------------------------------------------------------------------

namespace {

const TrainOptions& validated(const TrainOptions& o) {
  o.validate();
  return o;
}

Split checked_split(const std::vector<int64_t>& tokens, int64_t context_length) {
  Split s = split_90_10(tokens);
  const auto need = static_cast<size_t>(context_length + 1);
  if (s.train.size() < need || s.val.size() < need)
    throw std::invalid_argument(fmt::format(
        "the text has {} characters: its 90/10 split gives {} training and {} validation tokens, each "
        "needs at least --context-length + 1 = {}",
        tokens.size(), s.train.size(), s.val.size(), need));
  return s;
}

// ---- the two kinds of model, as the loop sees them ----------------------------------------

// The number after `prefix` in a parameter's name ("trf_blocks.3.att..." -> 3), or -1.
int64_t block_number(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size()));
}

class GptLanguageModel final : public LanguageModel {
 public:
  explicit GptLanguageModel(nn::GPTModel& m) : m_(m) {}
  nn::Module& module() override { return m_; }
  Tensor forward(const Tensor& ids) override { return m_.forward(ids); }
  float forward_loss(const Tensor& x, const Tensor& y) override { return m_.forward_loss(x, y); }
  void backward_loss() override { m_.backward_loss(); }
  void set_backward_hook(std::function<void(int64_t)> hook) override {
    m_.trf_blocks.set_backward_hook(std::move(hook));
  }
  int64_t num_blocks() const override { return m_.config().n_layers; }
  int64_t block_of(const std::string& name) const override {
    return block_number(name, "trf_blocks.");
  }
  bool in_head(const std::string& name) const override {
    return !m_.config().tie_embeddings &&
           (name.rfind("final_norm.", 0) == 0 || name.rfind("out_head.", 0) == 0);
  }
  int64_t vocab_size() const override { return m_.config().vocab_size; }
  int64_t context_length() const override { return m_.config().context_length; }
  int64_t num_parameters() override { return m_.num_parameters(); }
  std::string config_json() const override { return nn::config_to_json(m_.config()); }

 private:
  nn::GPTModel& m_;
};

class DecoderLanguageModel final : public LanguageModel {
 public:
  DecoderLanguageModel(nn::DecoderLM& m, const io::HfDecoderConfig& hub) : m_(m), hub_(hub) {}
  nn::Module& module() override { return m_; }
  Tensor forward(const Tensor& ids) override { return m_.forward(ids); }
  float forward_loss(const Tensor& x, const Tensor& y) override { return m_.forward_loss(x, y); }
  void backward_loss() override { m_.backward_loss(); }
  void set_backward_hook(std::function<void(int64_t)> hook) override {
    m_.set_backward_hook(std::move(hook));
  }
  int64_t num_blocks() const override { return m_.config().num_layers; }
  int64_t block_of(const std::string& name) const override {
    return block_number(name, "model.layers.");
  }
  bool in_head(const std::string& name) const override {
    return name.rfind("model.norm.", 0) == 0 ||
           (!m_.config().tie_embeddings && name.rfind("lm_head.", 0) == 0);
  }
  int64_t vocab_size() const override { return m_.config().vocab_size; }
  int64_t context_length() const override { return m_.config().context_length; }
  int64_t num_parameters() override { return m_.num_parameters(); }
  std::string config_json() const override {
    io::HfDecoderConfig hf = hub_;
    hf.config = m_.config();
    return io::hf_decoder_config_json(hf);
  }

 private:
  nn::DecoderLM& m_;
  const io::HfDecoderConfig& hub_;
};

// A decoder of today's open models built from the options (TrainOptions::arch).
io::HfDecoderConfig decoder_from_options(const TrainOptions& o, int64_t vocab_size) {
  io::HfDecoderConfig hf;
  nn::DecoderConfig& c = hf.config;
  const bool gemma = o.arch == "gemma3";
  hf.model_type = o.arch == "llama3" ? "llama" : o.arch == "qwen3" ? "qwen3" : "gemma3_text";
  c.family = hf.model_type;
  c.vocab_size = vocab_size;
  c.hidden_size = o.emb_dim;
  c.intermediate_size = o.ffn_dim > 0 ? o.ffn_dim : 3 * o.emb_dim;
  c.num_layers = o.n_layers;
  c.num_heads = o.n_heads;
  c.num_kv_heads = o.n_kv_groups > 0 ? o.n_kv_groups : o.n_heads;
  c.head_dim = o.head_dim > 0 ? o.head_dim : o.emb_dim / o.n_heads;
  c.context_length = o.context_length;
  c.norm_eps = o.arch == "llama3" ? 1e-5f : 1e-6f;
  c.qk_norm = o.arch != "llama3";
  c.rope.theta = static_cast<float>(o.theta_base);
  c.rope_local = c.rope;
  if (gemma) {
    c.norm_weight_offset = 1.0f;
    c.sandwich_norms = true;
    c.scale_embeddings = true;
    c.activation = nn::GateActivation::kGeluTanh;
    c.attention_scale = static_cast<float>(std::pow(static_cast<double>(c.head_dim), -0.5));
    c.rope_local.theta = 10000.0f;
  }
  if (o.sliding_window_size > 0) {
    if (o.arch == "llama3")
      throw std::invalid_argument(
          "--arch llama3 has no sliding-window layers (Llama's config.json cannot say them)");
    c.sliding_window = o.sliding_window_size;
    // The book's K:1 schedule: K windowed layers, then one full (-1: every layer windowed).
    const int64_t K = o.sliding_window_stride;
    for (int64_t i = 0; i < c.num_layers; ++i)
      c.layer_sliding.push_back(K < 0 ? true : K == 0 ? false : (i % (K + 1)) != K);
  }
  c.tie_embeddings = true;
  c.check();
  return hf;
}

}  // namespace

Trainer::Trainer(std::string_view text, const TrainOptions& options)
    : options_(validated(options)), gen_(std::make_unique<Generator>(options.seed)) {
  if (options_.tokenizer == "char") {
    chars_ = CharTokenizer::from_text(text);
    Split split = checked_split(chars_->encode(text), options_.context_length);
    train_ = std::make_unique<Batcher>(std::move(split.train), options_.batch_size,
                                       options_.context_length);
    val_ = std::make_unique<Batcher>(std::move(split.val), options_.batch_size, options_.context_length);
    build(chars_->size());
    return;
  }
  // The book's chapter 5: split_idx = int(0.9 * len(text)) characters, each
  // part tokenized with <|endoftext|> allowed.
  const std::vector<char32_t> chars = decode_utf8(text);  // throws naming the offset of bad UTF-8
  const auto split_chars = static_cast<size_t>(0.9 * static_cast<double>(chars.size()));
  size_t split_byte = 0;
  for (size_t i = 0; i < split_chars; ++i) split_byte += encode_utf8(chars[i]).size();
  if (options_.tokenizer == "hf") load_hf_tokenizer();
  const int64_t stride = options_.stride > 0 ? options_.stride : options_.context_length;
  train_loader_ = std::make_unique<WindowLoader>(
      encode(text.substr(0, split_byte)), options_.batch_size, options_.context_length, stride,
      /*shuffle=*/true, /*drop_last=*/true, "training");
  val_loader_ = std::make_unique<WindowLoader>(encode(text.substr(split_byte)), options_.batch_size,
                                               options_.context_length, stride, /*shuffle=*/false,
                                               /*drop_last=*/false, "validation");
  if (options_.epochs > 0)
    options_.max_iters = options_.epochs * train_loader_->batches() / options_.grad_accum_steps;
  build(hf_ ? hf_->vocab_size() : text::Tokenizer::gpt2().vocab_size());
}

void Trainer::load_hf_tokenizer() {
  namespace fs = std::filesystem;
  std::string path = options_.tokenizer_file.empty() ? options_.init_from : options_.tokenizer_file;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path = (fs::path(path) / "tokenizer.json").string();
  if (!fs::is_regular_file(path, ec))
    throw std::invalid_argument(
        fmt::format("--tokenizer hf: no tokenizer.json at '{}'", printable(path)));
  try {
    hf_tokenizer_json_ = read_file(path);  // a regular file, at most 4 GiB
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("--tokenizer hf: {}", e.what()));
  }
  hf_ = text::HfTokenizer::from_json(hf_tokenizer_json_, path);
}

const text::HfTokenizer& Trainer::hf_tokenizer() const {
  if (!hf_) throw std::logic_error("Trainer::hf_tokenizer(): this run has no tokenizer.json");
  return *hf_;
}

std::vector<int64_t> Trainer::encode(std::string_view text) const {
  if (hf_) return hf_->encode(text, /*add_special_tokens=*/false);
  if (options_.tokenizer == "gpt2")
    return text::Tokenizer::gpt2().encode(text, /*allow_special=*/true);
  throw std::logic_error("Trainer::encode: a char run encodes with tokenizer()");
}

std::string Trainer::decode(const std::vector<int64_t>& ids) const {
  if (hf_) return hf_->decode(ids);
  if (options_.tokenizer == "gpt2") return text::Tokenizer::gpt2().decode(ids);
  throw std::logic_error("Trainer::decode: a char run decodes with tokenizer()");
}

nn::GPTModel& Trainer::model() {
  if (!model_)
    throw std::logic_error("Trainer::model(): this run trains a decoder (Trainer::decoder())");
  return *model_;
}

nn::DecoderLM& Trainer::decoder() {
  if (!decoder_)
    throw std::logic_error("Trainer::decoder(): this run trains a GPT (Trainer::model())");
  return *decoder_;
}

Trainer::Trainer(std::shared_ptr<const data::TokenSource> tokens, int64_t vocab_size, const TrainOptions& options)
    : options_(validated(options)), gen_(std::make_unique<Generator>(options.seed)) {
  if (options_.tokenizer != "gpt2")
    throw std::invalid_argument(fmt::format(
        "training on prepared tokens needs --tokenizer gpt2 (the book's window loaders), got '{}'",
        printable(options_.tokenizer)));
  const int64_t n = tokens->size(), split = n * 9 / 10;
  const int64_t stride = options_.stride > 0 ? options_.stride : options_.context_length;
  train_loader_ = std::make_unique<WindowLoader>(data::slice(tokens, 0, split), options_.batch_size,
                                                 options_.context_length, stride, /*shuffle=*/true,
                                                 /*drop_last=*/true, "training");
  val_loader_ = std::make_unique<WindowLoader>(data::slice(tokens, split, n), options_.batch_size,
                                               options_.context_length, stride, /*shuffle=*/false,
                                               /*drop_last=*/false, "validation");
  if (options_.epochs > 0) options_.max_iters = options_.epochs * train_loader_->batches();
  if (const auto* shards = dynamic_cast<const data::ShardedTokens*>(tokens.get())) {
    const std::string manifest = shards->manifest().to_json();
    nlohmann::ordered_json id;
    const std::string& dir = shards->dir();
    id["dir"] = utf8_replacing_invalid(dir);
    if (!is_utf8(dir)) id["dir_hex"] = hex_of(dir);  // a path is bytes (attn/utf8.h)
    id["manifest_fnv1a64"] = fmt::format("{:016x}", fnv1a64(manifest.data(), manifest.size()));
    id["tokens"] = shards->size();
    data_shards_ = id.dump();
  }
  build(vocab_size);
}

void Trainer::build(int64_t vocab_size) {
  if (!options_.init_from.empty()) {  // fine-tuning: the directory's config and weights
    hub_ = io::load_hf_decoder(options_.init_from, decoder_).hf;
    if (vocab_size > decoder_->config().vocab_size)
      throw std::invalid_argument(fmt::format(
          "--init-from '{}': its tokenizer has {} ids, more than the model's vocab_size {}",
          printable(options_.init_from), vocab_size, decoder_->config().vocab_size));
    if (options_.context_length > decoder_->config().context_length)
      throw std::invalid_argument(
          fmt::format("--context-length {} passes the model's max_position_embeddings {} ('{}')",
                      options_.context_length, decoder_->config().context_length,
                      printable(options_.init_from)));
  } else if (options_.arch != "gpt") {
    hub_ = decoder_from_options(options_, vocab_size);
    if (options_.tokenizer == "gpt2") hub_.eos_token_ids = {text::Tokenizer::gpt2().eot_token()};
    {
      const nn::NoInitScope no_init;  // init_weights draws them: transformers' from_config
      decoder_ = std::make_unique<nn::DecoderLM>(hub_.config, *gen_);
    }
    decoder_->init_weights(*gen_);
  }
  if (decoder_) {
    decoder_->train();
    decoder_->make_grads();  // built under NoInitScope: none yet, and the optimizer reads them
    decoder_->set_compute_dtype(dtype_from_name(options_.dtype));  // --dtype bfloat16: autocast
    lm_ = std::make_unique<DecoderLanguageModel>(*decoder_, hub_);
  } else {
    build_gpt(vocab_size);
    lm_ = std::make_unique<GptLanguageModel>(*model_);
  }
  const optim::AdamWOptions adamw{.lr = options_.lr,
                                  .beta1 = options_.beta1,
                                  .beta2 = options_.beta2,
                                  .eps = 1e-8,
                                  .weight_decay = options_.weight_decay};
  nn::Module& module = lm_->module();
  if (options_.decay == "all") {  // AdamW(model.parameters(), weight_decay=...): one group
    optim::ParamGroup all{.params = {}, .weight_decay = options_.weight_decay};
    for (auto& [name, p] : module.named_parameters()) all.params.push_back(p);
    optimizer_ = std::make_unique<optim::AdamW>(std::vector<optim::ParamGroup>{all}, adamw);
  } else {
    optimizer_ = std::make_unique<optim::AdamW>(module, adamw);
  }
  params_ = module.named_parameters();
}

void Trainer::build_gpt(int64_t vocab_size) {
  const nn::GPTConfig cfg{.vocab_size = vocab_size,
                          .context_length = options_.context_length,
                          .emb_dim = options_.emb_dim,
                          .n_heads = options_.n_heads,
                          .n_layers = options_.n_layers,
                          .drop_rate = static_cast<float>(options_.drop_rate),
                          .qkv_bias = false,
                          .rope = options_.rope,
                          .theta_base = static_cast<float>(options_.theta_base),
                          .latent_dim = options_.latent_dim,
                          .n_kv_groups = options_.n_kv_groups,
                          .sliding_window_size = options_.sliding_window_size,
                          .sliding_window_stride = options_.sliding_window_stride};
  // Training uses the fused attention (with drop_rate 0 kAuto picks it anyway;
  // with dropout its Philox masks, not PyTorch's), or with `exact` the
  // reference paths and PyTorch's dropout masks (and the plain loss: the
  // reference layers never take the fused one).
  const nn::GPTOptions model_options =
      options_.exact ? nn::GPTOptions{.attention_backend = nn::AttentionBackend::kReference,
                                      .exact_dropout = true,
                                      .layers = nn::LayerImpl::kReference}
                     : nn::GPTOptions{.exact_dropout = false,
                                      .dtype = dtype_from_name(options_.dtype),
                                      .fused_loss = options_.fused_loss};
  model_ = std::make_unique<nn::GPTModel>(cfg, model_options, *gen_);
  model_->train();
}

const CharTokenizer& Trainer::tokenizer() const {
  if (!chars_)
    throw std::logic_error("Trainer::tokenizer(): a gpt2 run has no character vocabulary");
  return *chars_;
}

int64_t Trainer::train_tokens() const {
  return train_ ? train_->tokens() : train_loader_->tokens();
}

int64_t Trainer::val_tokens() const { return val_ ? val_->tokens() : val_loader_->tokens(); }

std::pair<Tensor, Tensor> Trainer::next_train_batch() {
  if (train_) return train_->next(*gen_);
  if (!train_loader_->in_pass()) {
    train_loader_->start_pass(*gen_);
    ++passes_;
  }
  return train_loader_->next();
}

uint64_t micro_batch_seed(uint64_t seed, int64_t step, int64_t micro_batch) {
  auto splitmix64 = [](uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(step)) ^
                    static_cast<uint64_t>(micro_batch));
}

void Trainer::set_collective(Collective* collective) {
  collective_ = collective;
  if (train_loader_ && options_.epochs > 0)
    options_.max_iters = options_.epochs * train_loader_->batches() / micro_batches();
  buckets_.clear();
  if (!collective_) return;
  // Buckets in the order backward finishes them: block n-1 (with final_norm and
  // out_head, whose gradients come first), ..., block 0, then the rest (the
  // embeddings, and a tied head).
  const int64_t L = lm_->num_blocks();
  buckets_.resize(static_cast<size_t>(L + 1));
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string& name = params_[i].first;
    size_t b = static_cast<size_t>(L);
    if (const int64_t block = lm_->block_of(name); block >= 0) {
      b = static_cast<size_t>(L - 1 - block);
    } else if (lm_->in_head(name)) {
      b = 0;
    }
    buckets_[b].push_back(i);
  }
  std::vector<std::vector<nn::Parameter*>> buckets;
  for (const auto& bucket : buckets_) {
    buckets.emplace_back();
    for (size_t i : bucket) buckets.back().push_back(params_[i].second);
  }
  collective_->set_buckets(buckets);
}

void Trainer::shard_optimizer() {
  const int N = ranks();
  if (N < 2 || sharded()) return;
  // Owners: the largest parameters first, each to the least-loaded rank (ties:
  // the lowest rank, then params_ order), the same on every rank.
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return params_[a].second->value.numel() > params_[b].second->value.numel();
  });
  owner_.assign(params_.size(), 0);
  std::vector<int64_t> load(static_cast<size_t>(N), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = static_cast<int>(r);
    load[r] += params_[i].second->value.numel();
  }
  const int me = collective_->rank();
  full_groups_ = optimizer_->groups();
  std::vector<optim::ParamGroup> mine;
  for (const auto& g : full_groups_) {
    optim::ParamGroup own{.params = {}, .weight_decay = g.weight_decay};
    for (nn::Parameter* p : g.params) {
      const auto it = std::find_if(params_.begin(), params_.end(), [&](const auto& np) { return np.second == p; });
      if (owner_[static_cast<size_t>(it - params_.begin())] == me) own.params.push_back(p);
    }
    mine.push_back(std::move(own));
  }
  const int64_t steps = optimizer_->steps();
  optimizer_ = std::make_unique<optim::AdamW>(mine, optim::AdamWOptions{.lr = options_.lr,
                                                                        .beta1 = options_.beta1,
                                                                        .beta2 = options_.beta2,
                                                                        .eps = 1e-8,
                                                                        .weight_decay = options_.weight_decay});
  optimizer_->set_steps(steps);
}

int64_t Trainer::optimizer_bytes() const {
  int64_t n = 0;
  for (const auto& g : optimizer_->groups())
    for (const nn::Parameter* p : g.params) n += 2 * p->value.numel() * static_cast<int64_t>(sizeof(float));
  return n;
}

void Trainer::bucket_ready(size_t b) {
  if (!accum_.empty()) {  // grad = acc + g_last: one add, as the sum in micro-batch order
    for (size_t i : buckets_[b]) {
      float* g = params_[i].second->grad.data();
      const float* a = accum_[i].data();
      const int64_t n = accum_[i].numel();
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
      for (int64_t j = 0; j < n; ++j) g[j] += a[j];
    }
  }
  if (collective_) collective_->start_bucket(b);
}

float Trainer::step_global() {
  const int64_t K = options_.grad_accum_steps, M = micro_batches();
  const int64_t rank = collective_ ? collective_->rank() : 0;
  // The whole global batch's windows, in micro-batch order, from the shared
  // generator; this rank runs micro-batches rank·K .. rank·K + K-1. Each is
  // drawn just before it runs and dropped after, so memory does not grow with
  // K (--grad-accum-steps 2^31 held every window at once); the other ranks'
  // windows are drawn and dropped, so the generator ends where it always did.
  for (int64_t m = 0; m < rank * K; ++m) (void)next_train_batch();
  const bool reseed = M > 1 && options_.drop_rate > 0.0;
  GeneratorState draws;  // the shared generator between draws, while reseed borrows it
  if (!grads_zero_) optimizer_->zero_grad();
  grads_zero_ = false;
  if (collective_ && buckets_.empty()) set_collective(collective_);
  if (buckets_.empty()) {  // one process: one bucket of everything
    buckets_.emplace_back();
    for (size_t i = 0; i < params_.size(); ++i) buckets_[0].push_back(i);
  }
  if (K > 1 && accum_.size() != params_.size()) {
    accum_.clear();
    for (auto& [name, p] : params_) accum_.emplace_back(p->grad.shape());
  }
  std::vector<double> losses(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) {
    const int64_t m = rank * K + k;
    if (reseed && k > 0) gen_->set_state(draws);
    const auto [x, y] = next_train_batch();
    if (reseed) {
      draws = gen_->get_state();
      gen_->set_state(Generator(micro_batch_seed(options_.seed, iter_, m)).get_state());
    }
    losses[static_cast<size_t>(k)] = lm_->forward_loss(x, y);
    if (k + 1 < K) {
      lm_->backward_loss();
      // accum = (accum + g_k), the gradients zeroed for the next micro-batch.
      for (size_t i = 0; i < params_.size(); ++i) {
        float* g = params_[i].second->grad.data();
        float* a = accum_[i].data();
        const int64_t n = accum_[i].numel();
        if (k == 0) {
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
          for (int64_t j = 0; j < n; ++j) { a[j] = g[j]; g[j] = 0.0f; }
        } else {
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
          for (int64_t j = 0; j < n; ++j) { a[j] += g[j]; g[j] = 0.0f; }
        }
      }
      continue;
    }
    // The last micro-batch: each bucket is handed on as backward finishes it.
    const size_t buckets = buckets_.size();
    if (buckets > 1) {
      const int64_t L = lm_->num_blocks();
      lm_->set_backward_hook(
          [this, L](int64_t block) { bucket_ready(static_cast<size_t>(L - 1 - block)); });
    }
    struct Unhook {
      LanguageModel& model;
      ~Unhook() { model.set_backward_hook(nullptr); }
    } unhook{*lm_};
    lm_->backward_loss();
    bucket_ready(buckets - 1);
  }
  if (reseed) gen_->set_state(draws);
  for (int64_t m = (rank + 1) * K; m < M; ++m) (void)next_train_batch();
  if (collective_) collective_->finish_buckets();
  const std::vector<double> all = collective_ ? collective_->allgather(losses) : losses;
  double loss_sum = 0.0;
  for (double l : all) loss_sum += l;
  // The mean over the M micro-batches: g · (1/M).
  if (M > 1) {
    const float inv = 1.0f / static_cast<float>(M);
    for (auto& [name, p] : params_) {
      float* g = p->grad.data();
      const int64_t n = p->grad.numel();
#pragma omp parallel for simd schedule(static) if (n > (int64_t{1} << 16))
      for (int64_t j = 0; j < n; ++j) g[j] *= inv;
    }
  }
  return static_cast<float>(loss_sum / static_cast<double>(M));
}

float Trainer::step() {
  const optim::CosineSchedule schedule{.learning_rate = options_.lr,
                                       .min_lr = options_.min_lr,
                                       .warmup_iters = options_.warmup_iters,
                                       .lr_decay_iters = options_.max_iters};
  optimizer_->set_lr(options_.lr_schedule == "constant" ? options_.lr
                                                       : optim::get_lr(iter_, schedule));
  float loss = 0.0f;
  if (micro_batches() > 1 || collective_) {
    loss = step_global();
  } else {
    auto [x, y] = next_train_batch();
    // The last step's AdamW pass left every gradient zero (step(.., true) below).
    if (!grads_zero_) optimizer_->zero_grad();
    grads_zero_ = false;
    // The mean cross-entropy, and with fused_loss its gradients, in one pass.
    loss = lm_->forward_loss(x, y);
    lm_->backward_loss();
  }
  // clip_grad_norm's g *= coefficient happens inside AdamW's pass (the same
  // bits), which also zeroes each gradient once read: one pass over them.
  float grad_scale = 1.0f;
  if (options_.grad_clip > 0.0) {
    std::vector<nn::Parameter*> params;
    params.reserve(params_.size());
    for (auto& [name, p] : params_) params.push_back(p);
    grad_scale = optim::clip_coefficient(params, options_.grad_clip);
  }
  optimizer_->step(grad_scale, /*zero_grad=*/true);
  if (sharded()) {  // the others' parameters: zero their gradients, take their values from the owner
    for (size_t i = 0; i < params_.size(); ++i) {
      nn::Parameter* p = params_[i].second;
      if (owner_[i] != collective_->rank()) p->grad.fill_(0.0f);
      collective_->broadcast(p->value.data(), p->value.numel(), owner_[i]);
    }
  }
  grads_zero_ = true;
  ++iter_;
  return loss;
}

EvalResult Trainer::evaluate(bool compute) {
  lm_->module().eval();
  auto batch_loss = [&](const std::pair<Tensor, Tensor>& xy) {
    return compute ? static_cast<double>(lm_->forward_loss(xy.first, xy.second)) : 0.0;
  };
  auto mean_loss = [&](const Batcher& data) {
    double sum = 0.0;
    for (int64_t k = 0; k < options_.eval_iters; ++k) sum += batch_loss(data.next(*gen_));
    return sum / static_cast<double>(options_.eval_iters);
  };
  // calc_loss_loader(loader, num_batches=eval_iters): a fresh pass (the
  // training pass in progress is untouched), its first batches.
  auto loader_loss = [&](const WindowLoader& loader) {
    WindowLoader pass = loader;
    pass.start_pass(*gen_);
    const int64_t n = std::min(options_.eval_iters, pass.batches());
    double sum = 0.0;
    for (int64_t k = 0; k < n; ++k) sum += batch_loss(pass.next());
    return sum / static_cast<double>(n);
  };
  EvalResult r;
  r.iter = iter_;
  r.train_loss = train_ ? mean_loss(*train_) : loader_loss(*train_loader_);
  r.val_loss = val_ ? mean_loss(*val_) : loader_loss(*val_loader_);
  lm_->module().train();
  last_eval_iter_ = iter_;
  return r;
}

std::map<std::string, std::string> Trainer::metadata() const {
  std::map<std::string, std::string> m{{"format", kCheckpointFormat},
                                       {"config", lm_->config_json()},
                                       {"tokenizer", options_.tokenizer},
                                       {"iter", std::to_string(iter_)},
                                       {"optim_step", std::to_string(optimizer_->steps())},
                                       {"train_args", options_.to_json()},
                                       {"generator", generator_to_json(gen_->get_state())},
                                       {"last_eval_iter", std::to_string(last_eval_iter_)}};
  if (chars_) m["vocab"] = chars_->to_json();
  if (decoder_) m["model_type"] = hub_.model_type;  // "config" is then the decoder's config.json
  if (micro_batches() > 1) {  // only then: a plain run's checkpoint keeps its bytes
    nlohmann::ordered_json g;
    g["ranks"] = ranks();
    g["grad_accum_steps"] = options_.grad_accum_steps;
    g["micro_batches"] = micro_batches();
    m["global_batch"] = g.dump();
  }
  if (!data_shards_.empty()) m["data_shards"] = data_shards_;
  if (train_loader_) {
    nlohmann::ordered_json loader;
    loader["passes"] = passes_;
    loader["in_pass"] = train_loader_->in_pass();
    loader["seed"] = train_loader_->pass_seed();
    loader["position"] = train_loader_->position();
    m["loader"] = loader.dump();
  }
  return m;
}

namespace {

// The optimizer's moments by parameter name, in the groups' order.
template <typename F>
void for_each_moment(optim::AdamW& opt, const std::vector<std::pair<std::string, nn::Parameter*>>& params,
                     F&& f) {
  const auto& groups = opt.groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const auto it = std::find_if(params.begin(), params.end(),
                                   [&](const auto& np) { return np.second == groups[g].params[i]; });
      f(it->first, opt.exp_avg(g, i), opt.exp_avg_sq(g, i));
    }
  }
}

}  // namespace

void Trainer::save(const std::string& path) const {
  const bool root = !collective_ || collective_->rank() == 0;
  std::vector<std::pair<std::string, Tensor>> tensors = lm_->module().state_dict();
  if (!sharded()) {
    if (!root) return;
    for_each_moment(*optimizer_, params_, [&](const std::string& name, const Tensor& m, const Tensor& v) {
      tensors.emplace_back("optim." + name + ".exp_avg", m);
      tensors.emplace_back("optim." + name + ".exp_avg_sq", v);
    });
  } else {
    // Every moment from its owner, in the unsharded optimizer's order.
    std::map<const nn::Parameter*, std::pair<Tensor, Tensor>> own;
    for_each_moment(*optimizer_, params_, [&](const std::string& name, const Tensor& m, const Tensor& v) {
      const auto it = std::find_if(params_.begin(), params_.end(), [&](const auto& np) { return np.first == name; });
      own[it->second] = {m, v};
    });
    for (const auto& g : full_groups_) {
      for (const nn::Parameter* p : g.params) {
        const auto it = std::find_if(params_.begin(), params_.end(), [&](const auto& np) { return np.second == p; });
        const int owner = owner_[static_cast<size_t>(it - params_.begin())];
        Tensor m(p->value.shape()), v(p->value.shape());
        if (owner == collective_->rank()) {
          m.copy_(own.at(p).first);
          v.copy_(own.at(p).second);
        }
        collective_->broadcast(m.data(), m.numel(), owner);
        collective_->broadcast(v.data(), v.numel(), owner);
        tensors.emplace_back("optim." + it->first + ".exp_avg", m);
        tensors.emplace_back("optim." + it->first + ".exp_avg_sq", v);
      }
    }
    if (!root) return;
  }
  io::write_safetensors(path, tensors, metadata());
}

void Trainer::check_gpt_config(const std::map<std::string, std::string>& m,
                               const std::string& path) const {
  const nn::GPTConfig saved = nn::config_from_json(meta(m, "config", path), path);
  const nn::GPTConfig& cfg = model_->config();
  auto check = [&](const char* name, auto a, auto b) {
    if (a != b)
      throw std::invalid_argument(
          fmt::format("config mismatch: checkpoint '{}' has {} = {}, this run {}", printable(path),
                      printable(name), a, b));
  };
  check("context_length", saved.context_length, cfg.context_length);
  check("emb_dim", saved.emb_dim, cfg.emb_dim);
  check("n_heads", saved.n_heads, cfg.n_heads);
  check("n_layers", saved.n_layers, cfg.n_layers);
  check("drop_rate", saved.drop_rate, cfg.drop_rate);
  check("qkv_bias", saved.qkv_bias, cfg.qkv_bias);
  check("rope", saved.rope, cfg.rope);
  check("theta_base", saved.theta_base, cfg.theta_base);
  check("latent_dim", saved.latent_dim, cfg.latent_dim);
  check("n_kv_groups", saved.n_kv_groups, cfg.n_kv_groups);
  check("sliding_window_size", saved.sliding_window_size, cfg.sliding_window_size);
  if (cfg.sliding_window_size > 0)
    check("sliding_window_stride", saved.sliding_window_stride, cfg.sliding_window_stride);
}

void Trainer::resume(const std::string& path) {
  const io::SafetensorsFile file = io::read_safetensors(path);
  const auto& m = file.metadata;
  if (meta(m, "format", path) != kCheckpointFormat)
    throw std::invalid_argument(fmt::format("checkpoint '{}' has format \"{}\", expected \"{}\"", printable(path),
                                            meta(m, "format", path), kCheckpointFormat));
  const auto tok = m.find("tokenizer");
  const std::string saved_tokenizer = tok == m.end() ? "char" : tok->second;  // older checkpoints: char
  if (saved_tokenizer != options_.tokenizer)
    throw std::invalid_argument(fmt::format("checkpoint '{}' was trained with --tokenizer {}, this run uses {}",
                                            printable(path), printable(saved_tokenizer), options_.tokenizer));
  if (chars_) {
    const CharTokenizer vocab = CharTokenizer::from_json(meta(m, "vocab", path));
    if (vocab.vocab() != chars_->vocab())
      throw std::invalid_argument(fmt::format(
          "checkpoint '{}' has a vocabulary of {} characters that differs from this text's {} characters",
          printable(path), vocab.size(), chars_->size()));
  }
  // The token shards a --data-shards run trained on: another folder's (by its
  // manifest's checksum and token count) would continue on other data. A
  // checkpoint without the field (a text run, or older) resumes as before.
  if (const auto ds = m.find("data_shards"); ds != m.end()) {
    std::string dir, sum;
    int64_t tokens = 0;
    try {
      const json saved = json::parse(ds->second);
      dir = saved.contains("dir_hex") ? bytes_of_hex(saved.at("dir_hex").get<std::string>())
                                      : saved.at("dir").get<std::string>();
      sum = saved.at("manifest_fnv1a64").get<std::string>();
      tokens = saved.at("tokens").get<int64_t>();
    } catch (const json::exception& e) {
      throw std::invalid_argument(
          fmt::format("checkpoint '{}': metadata \"data_shards\": {}", printable(path), printable(e.what())));
    }
    if (data_shards_.empty())
      throw std::invalid_argument(fmt::format(
          "checkpoint '{}' was trained on the token shards in '{}'; this run reads a text: resume it "
          "with --data-shards",
          printable(path), printable(dir)));
    const json now = json::parse(data_shards_);
    const std::string now_sum = now.at("manifest_fnv1a64").get<std::string>();
    const int64_t now_tokens = now.at("tokens").get<int64_t>();
    if (sum != now_sum || tokens != now_tokens)
      throw std::invalid_argument(fmt::format(
          "checkpoint '{}' was trained on the token shards in '{}' (manifest {}, {} tokens); "
          "this run reads '{}' (manifest {}, {} tokens)",
          printable(path), printable(dir), printable(sum), tokens,
          printable(now.contains("dir_hex") ? bytes_of_hex(now.at("dir_hex").get<std::string>())
                                            : now.at("dir").get<std::string>()),
          now_sum, now_tokens));
  }
  int64_t saved_micro = 1;
  if (const auto gb = m.find("global_batch"); gb != m.end()) {
    try {
      saved_micro = json::parse(gb->second).at("micro_batches").get<int64_t>();
    } catch (const json::exception& e) {
      throw std::invalid_argument(
          fmt::format("checkpoint '{}': metadata \"global_batch\": {}", printable(path), printable(e.what())));
    }
  }
  if (saved_micro != micro_batches())
    throw std::invalid_argument(fmt::format(
        "checkpoint '{}' was trained with {} micro-batches per step (ranks x --grad-accum-steps), "
        "this run has {} ranks x {} = {}: a resumed run needs the same global batch (choose "
        "--grad-accum-steps so that ranks x K = {})",
        printable(path), saved_micro, ranks(), options_.grad_accum_steps, micro_batches(), saved_micro));
  int64_t passes = 0, loader_seed = 0, loader_position = 0;
  bool in_pass = false;
  if (train_loader_) {
    try {
      const json loader = json::parse(meta(m, "loader", path));
      passes = loader.at("passes").get<int64_t>();
      in_pass = loader.at("in_pass").get<bool>();
      loader_seed = loader.at("seed").get<int64_t>();
      loader_position = loader.at("position").get<int64_t>();
    } catch (const json::exception& e) {
      throw std::invalid_argument(
          fmt::format("checkpoint '{}': metadata \"loader\": {}", printable(path), printable(e.what())));
    }
    if (in_pass && (loader_position < 0 || loader_position >= train_loader_->batches()))
      throw std::invalid_argument(fmt::format(
          "checkpoint '{}': the training pass is at batch {} of {} (a different text or batch size?)",
          printable(path), loader_position, train_loader_->batches()));
  }
  const auto saved_type = m.find("model_type");
  if ((saved_type != m.end()) != (decoder_ != nullptr) ||
      (decoder_ && saved_type->second != hub_.model_type))
    throw std::invalid_argument(
        fmt::format("checkpoint '{}' holds a {}; this run trains a {}", printable(path),
                    saved_type == m.end() ? std::string("GPT") : printable(saved_type->second),
                    decoder_ ? hub_.model_type : std::string("GPT")));
  if (decoder_) {
    const std::string& saved = meta(m, "config", path);
    if (saved != lm_->config_json())
      throw std::invalid_argument(fmt::format(
          "config mismatch: checkpoint '{}' holds another {} (its config.json differs from this "
          "run's: the sizes, window or RoPE flags)",
          printable(path), hub_.model_type));
  } else {
    check_gpt_config(m, path);
  }

  const int64_t iter = meta_int(m, "iter", path);
  const int64_t optim_step = meta_int(m, "optim_step", path);
  const int64_t last_eval = meta_int(m, "last_eval_iter", path, -1);
  if (last_eval > iter)
    throw std::invalid_argument(
        fmt::format("checkpoint '{}': metadata \"last_eval_iter\" = {} is past \"iter\" = {}",
                    printable(path), last_eval, iter));
  const GeneratorState gen_state = generator_from_json(meta(m, "generator", path));

  // Every tensor must be there with its shape before anything is written.
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : file.tensors) by_name[name] = &t;
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // destination, source
  auto want = [&](const std::string& name, const Tensor& dst) {
    const auto it = by_name.find(name);
    if (it == by_name.end())
      throw std::invalid_argument(fmt::format("checkpoint '{}' has no tensor \"{}\"", printable(path), printable(name)));
    if (it->second->dtype() != DType::kFloat32 || it->second->shape() != dst.shape())
      throw std::invalid_argument(fmt::format("checkpoint '{}': tensor \"{}\" is {} {}, expected F32 {}", printable(path),
                                              printable(name), dtype_name(it->second->dtype()),
                                              shape_str(it->second->shape()), shape_str(dst.shape())));
    copies.emplace_back(dst, it->second);
    by_name.erase(it);
  };
  for (auto& [name, t] : lm_->module().state_dict()) want(name, t);
  for_each_moment(*optimizer_, params_, [&](const std::string& name, Tensor& mo, Tensor& v) {
    want("optim." + name + ".exp_avg", mo);
    want("optim." + name + ".exp_avg_sq", v);
  });
  if (sharded()) {  // the other ranks' moments are theirs to read
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] == collective_->rank()) continue;
      by_name.erase("optim." + params_[i].first + ".exp_avg");
      by_name.erase("optim." + params_[i].first + ".exp_avg_sq");
    }
  }
  if (!by_name.empty())
    throw std::invalid_argument(
        fmt::format("checkpoint '{}' has an unexpected tensor \"{}\"", printable(path), printable(by_name.begin()->first)));

  gen_->set_state(gen_state);
  if (train_loader_) {
    passes_ = passes;
    if (in_pass) train_loader_->restore_pass(loader_seed, loader_position);
  }
  for (auto& [dst, src] : copies) dst.copy_(*src);
  optimizer_->set_steps(optim_step);
  iter_ = iter;
  last_eval_iter_ = last_eval;
}

}  // namespace attn::train
