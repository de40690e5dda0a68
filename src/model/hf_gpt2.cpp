// Hugging Face GPT-2 directories in and out (attn/hf_gpt2.h).
//
// Reading: config.json gives the GPTConfig; every name of model.safetensors is
// matched against the names that config implies (with or without
// "transformer."), shapes and dtypes checked, and only then is the model built
// and each tensor converted from the mapped file into its parameter (the
// Conv1D weights transposed, c_attn split into q, k, v).
#include "attn/hf_gpt2.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "attn/atomic_file.h"
#include "attn/checkpoint.h"
#include "attn/float_decimal.h"
#include "attn/read_file.h"
#include "attn/safetensors.h"
#include "attn/utf8.h"

namespace attn::io {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kPrefix = "transformer.";

std::string named(const std::string& s) {
  std::string out = "'";  // (appending, not "'" + ...: GCC 12's false -Wrestrict at -O3)
  out += printable(s);
  out += "'";
  return out;
}

// The Python line that turns a pickled state_dict into a safetensors file
// (clone(): tied tensors share storage, which safetensors refuses).
std::string pickle_message(const std::string& file) {
  const fs::path p(file);
  const std::string name = p.filename().string();
  if (name == "pytorch_model.bin") {
    const std::string out = (p.parent_path() / "model.safetensors").string();
    return fmt::format(
        "{} is a PyTorch pickle (torch.save), which attn does not read (unpickling can run "
        "code); convert it once to {} with: python3 -c \"import torch; from safetensors.torch "
        "import save_file; sd = torch.load('{}', map_location='cpu'); save_file({{k: "
        "v.clone().contiguous() for k, v in sd.items()}}, '{}', metadata={{'format': 'pt'}})\"",
        named(file), named(out), printable(file), printable(out));
  }
  const std::string out = (p.parent_path() / "checkpoint.safetensors").string();
  return fmt::format(
      "{} is a PyTorch pickle (torch.save), which attn does not read (unpickling can run code); "
      "a state_dict of the book's GPTModel becomes an attn checkpoint with (put your model's "
      "GPT_CONFIG in config, and 'char' or 'gpt2' as its tokenizer): python3 -c \"import json, "
      "torch; from safetensors.torch import save_file; sd = torch.load('{}', map_location='cpu'); "
      "sd = sd.get('model_state_dict', sd); save_file({{k: v.clone().contiguous() for k, v in "
      "sd.items()}}, '{}', metadata={{'format': 'attn-checkpoint-1', "
      "'tokenizer': 'gpt2', 'config': json.dumps(dict(vocab_size=50257, context_length=1024, "
      "emb_dim=768, n_heads=12, n_layers=12, drop_rate=0.0, qkv_bias=True))}})\"",
      named(file), printable(file), printable(out));
}

bool is_pickle_name(const std::string& name) {
  return name == "pytorch_model.bin" || name.ends_with(".pth") || name.ends_with(".pt") ||
         name.ends_with(".ckpt");
}

// Names of the file's weights for a config, without the prefix: name -> shape.
std::map<std::string, Shape> expected_shapes(const nn::GPTConfig& c, bool lm_head) {
  const int64_t E = c.emb_dim, V = c.vocab_size;
  std::map<std::string, Shape> m = {{"wte.weight", {V, E}},
                                    {"wpe.weight", {c.context_length, E}},
                                    {"ln_f.weight", {E}},
                                    {"ln_f.bias", {E}}};
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string h = fmt::format("h.{}.", i);
    m[h + "ln_1.weight"] = {E};
    m[h + "ln_1.bias"] = {E};
    m[h + "attn.c_attn.weight"] = {E, 3 * E};
    m[h + "attn.c_attn.bias"] = {3 * E};
    m[h + "attn.c_proj.weight"] = {E, E};
    m[h + "attn.c_proj.bias"] = {E};
    m[h + "ln_2.weight"] = {E};
    m[h + "ln_2.bias"] = {E};
    m[h + "mlp.c_fc.weight"] = {E, 4 * E};
    m[h + "mlp.c_fc.bias"] = {4 * E};
    m[h + "mlp.c_proj.weight"] = {4 * E, E};
    m[h + "mlp.c_proj.bias"] = {E};
  }
  if (lm_head) m["lm_head.weight"] = {V, E};
  return m;
}

// h.N.attn.bias / h.N.attn.masked_bias with N < n_layers: buffers, not weights.
bool is_ignored_buffer(const std::string& key, int64_t n_layers) {
  if (!key.starts_with("h.")) return false;
  const size_t dot = key.find('.', 2);
  if (dot == std::string::npos) return false;
  const std::string index = key.substr(2, dot - 2);
  if (index.empty() || index.size() > 6 ||
      !std::all_of(index.begin(), index.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
    return false;
  if (std::stoll(index) >= n_layers) return false;
  const std::string rest = key.substr(dot + 1);
  return rest == "attn.bias" || rest == "attn.masked_bias";
}

// dst (out, in) = src (in, out) transposed, reading the columns [col0, col0 + out) of src
// whose rows have `src_cols` values.
void transpose_into(float* dst, const float* src, int64_t in, int64_t out, int64_t src_cols,
                    int64_t col0) {
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t i = 0; i < in; ++i) dst[o * in + i] = src[i * src_cols + col0 + o];
  }
}

}  // namespace

// ---- reading ----------------------------------------------------------------------------------

bool is_hf_gpt2_dir(const std::string& dir) {
  return fs::is_directory(dir) && fs::is_regular_file(fs::path(dir) / "config.json");
}

HfGpt2Config read_hf_gpt2_config(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(file)) {
    throw std::invalid_argument(
        fmt::format("{} does not exist (a Hugging Face model directory has config.json and "
                    "model.safetensors)",
                    named(file)));
  }
  return parse_hf_gpt2_config(read_file(file, uint64_t{64} << 20), file);  // at most 64 MiB
}

HfGpt2Info load_hf_gpt2(const std::string& dir, std::unique_ptr<nn::GPTModel>& model,
                        const nn::GPTOptions& options) {
  HfGpt2Info info;
  info.hf = read_hf_gpt2_config(dir);
  const nn::GPTConfig& cfg = info.hf.config;
  const fs::path d(dir);
  info.weights_path = (d / "model.safetensors").string();
  if (!fs::exists(info.weights_path)) {
    if (fs::exists(d / "pytorch_model.bin"))
      throw std::invalid_argument(pickle_message((d / "pytorch_model.bin").string()));
    if (fs::exists(d / "model.safetensors.index.json")) {
      throw std::invalid_argument(fmt::format(
          "{} holds a sharded checkpoint (model.safetensors.index.json); attn reads one "
          "model.safetensors: save it with save_pretrained(DIR, max_shard_size='100GB')",
          named(dir)));
    }
    throw std::invalid_argument(
        fmt::format("{} does not exist (a Hugging Face model directory has config.json and "
                    "model.safetensors)",
                    named(info.weights_path)));
  }
  const MappedSafetensors file(info.weights_path);
  const std::string& path = info.weights_path;

  // Every name of the file, without the prefix -> its entry.
  std::map<std::string, const SafetensorsEntry*> by_key;
  std::set<std::string> dtypes;
  for (const auto& e : file.header().entries) {
    std::string key = e.name;
    if (key.starts_with(kPrefix)) {
      key = key.substr(std::strlen(kPrefix));
      info.prefixed = true;
    }
    if (is_ignored_buffer(key, cfg.n_layers)) {
      ++info.ignored_buffers;
      continue;
    }
    if (!by_key.emplace(key, &e).second) {
      throw std::invalid_argument(fmt::format("{}: holds both {} and {}", named(path),
                                              named(key), named(std::string(kPrefix) + key)));
    }
  }
  info.lm_head_stored = by_key.count("lm_head.weight") > 0;
  if (!cfg.tie_embeddings && !info.lm_head_stored) {
    throw std::invalid_argument(
        fmt::format("{}: no tensor 'lm_head.weight', which config.json's tie_word_embeddings "
                    "false needs",
                    named(path)));
  }
  const std::map<std::string, Shape> expected = expected_shapes(cfg, info.lm_head_stored);
  for (const auto& [key, e] : by_key) {
    if (expected.count(key) == 0) {
      throw std::invalid_argument(fmt::format(
          "{}: tensor {} is not a GPT-2 weight of this config (n_layer {}; known: wte, wpe, "
          "h.N.ln_1/attn.c_attn/attn.c_proj/ln_2/mlp.c_fc/mlp.c_proj, ln_f, lm_head, and the "
          "buffers h.N.attn.bias, h.N.attn.masked_bias)",
          named(path), named(e->name), cfg.n_layers));
    }
  }
  for (const auto& [key, shape] : expected) {
    const auto it = by_key.find(key);
    if (it == by_key.end()) {
      throw std::invalid_argument(fmt::format("{}: no tensor {} (nor {}); config.json says n_layer {}",
                                              named(path), named(key),
                                              named(std::string(kPrefix) + key), cfg.n_layers));
    }
    const SafetensorsEntry& e = *it->second;
    if (e.shape != shape) {
      throw std::invalid_argument(fmt::format(
          "{}: tensor {} has shape {}, expected {} for config.json's n_embd {}, vocab_size {}, "
          "n_positions {}",
          named(path), named(e.name), shape_str(e.shape), shape_str(shape), cfg.emb_dim,
          cfg.vocab_size, cfg.context_length));
    }
    if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16") {
      throw std::invalid_argument(fmt::format(
          "{}: tensor {} has dtype {}; GPT-2 weights are F32, F16 or BF16", named(path),
          named(e.name), e.dtype));
    }
    dtypes.insert(e.dtype);
  }
  info.file_dtype = dtypes.size() == 1 ? *dtypes.begin() : "mixed";

  // The model: its initial weights come from a generator of their own (all replaced).
  nn::GPTConfig model_cfg = cfg;
  model_cfg.tie_embeddings = !info.lm_head_stored;
  Generator scratch;
  auto m = std::make_unique<nn::GPTModel>(model_cfg, options, scratch);
  const int64_t E = cfg.emb_dim;
  auto entry = [&](const std::string& key) -> const SafetensorsEntry& { return *by_key.at(key); };
  auto load = [&](const std::string& key, nn::Parameter& p) {
    file.read_float32(entry(key), p.value.data());
  };
  // A Conv1D weight (in, out) into a Linear's (out, in), from columns [col0, col0 + out).
  std::vector<float> scratch_buf;
  auto load_t = [&](const std::string& key, nn::Parameter& p, int64_t col0 = 0) {
    const SafetensorsEntry& e = entry(key);
    scratch_buf.resize(static_cast<size_t>(e.nbytes() / e.element_size));
    file.read_float32(e, scratch_buf.data());
    const int64_t out = p.value.size(0), in = p.value.size(1);
    transpose_into(p.value.data(), scratch_buf.data(), in, out, e.shape[1], col0);
  };
  load("wte.weight", m->tok_emb.weight);
  load("wpe.weight", m->pos_emb.weight);
  for (int64_t i = 0; i < cfg.n_layers; ++i) {
    const std::string h = fmt::format("h.{}.", i);
    nn::TransformerBlock& b = m->trf_blocks[i];
    load(h + "ln_1.weight", b.norm1.scale);
    load(h + "ln_1.bias", b.norm1.shift);
    load_t(h + "attn.c_attn.weight", b.att.W_query.weight, 0);
    load_t(h + "attn.c_attn.weight", b.att.W_key.weight, E);
    load_t(h + "attn.c_attn.weight", b.att.W_value.weight, 2 * E);
    std::vector<float> qkv(static_cast<size_t>(3 * E));
    file.read_float32(entry(h + "attn.c_attn.bias"), qkv.data());
    std::copy_n(qkv.data(), E, b.att.W_query.bias.value.data());
    std::copy_n(qkv.data() + E, E, b.att.W_key.bias.value.data());
    std::copy_n(qkv.data() + 2 * E, E, b.att.W_value.bias.value.data());
    load_t(h + "attn.c_proj.weight", b.att.out_proj.weight);
    load(h + "attn.c_proj.bias", b.att.out_proj.bias);
    load(h + "ln_2.weight", b.norm2.scale);
    load(h + "ln_2.bias", b.norm2.shift);
    load_t(h + "mlp.c_fc.weight", b.ff.fc.weight);
    load(h + "mlp.c_fc.bias", b.ff.fc.bias);
    load_t(h + "mlp.c_proj.weight", b.ff.proj.weight);
    load(h + "mlp.c_proj.bias", b.ff.proj.bias);
  }
  load("ln_f.weight", m->final_norm.scale);
  load("ln_f.bias", m->final_norm.shift);
  if (info.lm_head_stored) load("lm_head.weight", m->out_head.weight);
  m->eval();
  model = std::move(m);
  return info;
}

// ---- writing ----------------------------------------------------------------------------------

HfDType hf_dtype_from_name(const std::string& name) {
  if (name == "float32") return HfDType::kFloat32;
  if (name == "bfloat16") return HfDType::kBFloat16;
  if (name == "float16") return HfDType::kFloat16;
  throw std::invalid_argument(fmt::format(
      "dtype must be float32, bfloat16 or float16, got {}", named(name)));
}

std::vector<std::pair<std::string, Tensor>> hf_gpt2_state_dict(nn::GPTModel& m) {
  const nn::GPTConfig& c = m.config();
  if (c.rope || c.latent_dim > 0) {
    throw std::invalid_argument(
        "hf_gpt2_state_dict: a model with rope or latent_dim is not GPT-2; GPT-2's format cannot "
        "hold it");
  }
  const int64_t E = c.emb_dim;
  std::vector<std::pair<std::string, Tensor>> out;
  auto plain = [&](const std::string& name, const nn::Parameter& p) {  // the model's own storage
    out.emplace_back(name, p.value.contiguous());
  };
  auto conv1d = [&](const std::string& name, const nn::Parameter& p) {  // (out, in) -> (in, out)
    out.emplace_back(name, p.value.transpose(0, 1).contiguous());  // a new tensor
  };
  plain("wte.weight", m.tok_emb.weight);
  plain("wpe.weight", m.pos_emb.weight);
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string h = fmt::format("h.{}.", i);
    nn::TransformerBlock& b = m.trf_blocks[i];
    plain(h + "ln_1.weight", b.norm1.scale);
    plain(h + "ln_1.bias", b.norm1.shift);
    Tensor w({E, 3 * E}), bias = Tensor::zeros({3 * E});  // (E, 3E) = [Wq^T | Wk^T | Wv^T]
    const nn::Linear* qkv[3] = {&b.att.W_query, &b.att.W_key, &b.att.W_value};
    for (int64_t part = 0; part < 3; ++part) {
      const Tensor wt = qkv[part]->weight.value.contiguous();  // (E out, E in)
      const float* src = wt.data();
      float* dst = w.data();
      for (int64_t o = 0; o < E; ++o) {
        for (int64_t in = 0; in < E; ++in) dst[in * 3 * E + part * E + o] = src[o * E + in];
      }
      if (qkv[part]->options().bias) {
        const Tensor bv = qkv[part]->bias.value.contiguous();
        std::copy_n(bv.data(), E, bias.data() + part * E);
      }
    }
    out.emplace_back(h + "attn.c_attn.weight", w);
    out.emplace_back(h + "attn.c_attn.bias", bias);
    conv1d(h + "attn.c_proj.weight", b.att.out_proj.weight);
    plain(h + "attn.c_proj.bias", b.att.out_proj.bias);
    plain(h + "ln_2.weight", b.norm2.scale);
    plain(h + "ln_2.bias", b.norm2.shift);
    conv1d(h + "mlp.c_fc.weight", b.ff.fc.weight);
    plain(h + "mlp.c_fc.bias", b.ff.fc.bias);
    conv1d(h + "mlp.c_proj.weight", b.ff.proj.weight);
    plain(h + "mlp.c_proj.bias", b.ff.proj.bias);
  }
  plain("ln_f.weight", m.final_norm.scale);
  plain("ln_f.bias", m.final_norm.shift);
  if (!m.out_head.weight.is(m.tok_emb.weight)) plain("lm_head.weight", m.out_head.weight);
  return out;
}

void save_hf_gpt2(nn::GPTModel& model, const std::string& dir, HfDType dtype) {
  const nn::GPTConfig& c = model.config();
  if (c.n_kv_groups != 0 || c.sliding_window_size != 0) {
    throw std::invalid_argument(fmt::format(
        "save_hf_gpt2: GPT-2's layout has no grouped-query or sliding-window attention, got "
        "n_kv_groups {} and sliding_window_size {}",
        c.n_kv_groups, c.sliding_window_size));
  }
  const bool tied = model.out_head.weight.is(model.tok_emb.weight);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw std::runtime_error(
        fmt::format("cannot create the directory {}: {}", named(dir), ec.message()));
  }
  const char* dtype_name = dtype == HfDType::kFloat32    ? "float32"
                           : dtype == HfDType::kBFloat16 ? "bfloat16"
                                                         : "float16";
  const char* st_dtype = dtype == HfDType::kFloat32    ? "F32"
                         : dtype == HfDType::kBFloat16 ? "BF16"
                                                       : "F16";
  // The tensors' bytes in the file's dtype, each kept alive until the write:
  // float32 straight from the state dict's tensors (no second copy of the
  // model: a 124M model's export would hold 650 MB more at once), 16-bit types
  // converted into their own buffers.
  const auto state = hf_gpt2_state_dict(model);
  std::vector<std::vector<std::byte>> bytes;
  bytes.reserve(state.size());
  std::vector<RawTensor> raw;
  for (const auto& [key, t] : state) {
    const float* v = t.data();
    const auto n = static_cast<size_t>(t.numel());
    std::vector<std::byte>& b = bytes.emplace_back();
    std::span<const std::byte> data;
    if (dtype == HfDType::kFloat32) {
      data = {reinterpret_cast<const std::byte*>(v), 4 * n};
    } else {
      b.resize(2 * n);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = dtype == HfDType::kBFloat16 ? to_bfloat16(v[i]).bits : float_to_half(v[i]);
        std::memcpy(b.data() + 2 * i, &h, 2);
      }
      data = b;
    }
    // save_pretrained's names: the model's under "transformer.", lm_head as it is.
    const std::string name = key == "lm_head.weight" ? key : kPrefix + key;
    raw.push_back({name, st_dtype, t.shape(), data});
  }
  write_safetensors((fs::path(dir) / "model.safetensors").string(), raw, {{"format", "pt"}});

  nlohmann::ordered_json j;
  j["activation_function"] = "gelu_new";
  j["architectures"] = {"GPT2LMHeadModel"};
  j["attn_pdrop"] = shortest_decimal(c.drop_rate);
  j["bos_token_id"] = 50256;
  j["embd_pdrop"] = shortest_decimal(c.drop_rate);
  j["eos_token_id"] = 50256;
  j["initializer_range"] = 0.02;
  // The float's shortest decimal (1e-05, not 9.999999747378752e-06).
  j["layer_norm_epsilon"] = shortest_decimal(c.layer_norm_eps);
  j["model_type"] = "gpt2";
  j["n_embd"] = c.emb_dim;
  j["n_head"] = c.n_heads;
  j["n_inner"] = nullptr;
  j["n_layer"] = c.n_layers;
  j["n_positions"] = c.context_length;
  j["resid_pdrop"] = shortest_decimal(c.drop_rate);
  j["scale_attn_weights"] = true;
  j["tie_word_embeddings"] = tied;
  j["dtype"] = dtype_name;  // transformers 5 (4.56 on) writes "dtype" where 4.x wrote "torch_dtype"
  j["use_cache"] = true;
  j["vocab_size"] = c.vocab_size;
  write_file_atomically((fs::path(dir) / "config.json").string(), j.dump(2) + "\n");
}

// ---- any model directory ----------------------------------------------------------------------

ModelDir load_model_dir(const std::string& dir, std::unique_ptr<nn::GPTModel>& model,
                        const nn::GPTOptions& options) {
  ModelDir out;
  out.dir = dir;
  const fs::path d(dir);
  if (fs::is_regular_file(d)) {
    const std::string name = d.filename().string();
    if (is_pickle_name(name) || name.ends_with(".bin")) throw std::invalid_argument(pickle_message(dir));
    throw std::invalid_argument(fmt::format(
        "{} is a file; give the model directory (config.json + model.safetensors, or an attn "
        "checkpoint directory with checkpoint.safetensors)",
        named(dir)));
  }
  // A config.json that is there but not a file (a directory, a FIFO) would
  // otherwise send the directory on as an attn checkpoint missing its file.
  if (std::error_code ec; fs::is_directory(d, ec) && fs::exists(d / "config.json", ec) &&
                          !fs::is_regular_file(d / "config.json", ec)) {
    throw std::invalid_argument(
        fmt::format("{} is not a regular file (a directory or a special file)",
                    named((d / "config.json").string())));
  }
  if (is_hf_gpt2_dir(dir)) {
    out.kind = ModelDir::Kind::kHuggingFace;
    out.hf = load_hf_gpt2(dir, model, options);
    out.config = out.hf.hf.config;
    out.tokenizer = "gpt2";
    return out;
  }
  if (fs::is_directory(d) && !fs::exists(d / "checkpoint.safetensors")) {
    for (const auto& e : fs::directory_iterator(d)) {
      if (e.is_regular_file() && is_pickle_name(e.path().filename().string()))
        throw std::invalid_argument(pickle_message(e.path().string()));
    }
  }
  // An attn checkpoint directory; nn::load_checkpoint names what is missing.
  out.kind = ModelDir::Kind::kAttnCheckpoint;
  nn::Checkpoint ck = nn::load_checkpoint(dir, model, options);
  out.config = ck.config;
  out.tokenizer = ck.tokenizer;
  out.vocab = std::move(ck.vocab);
  out.metadata = std::move(ck.metadata);
  return out;
}

}  // namespace attn::io
