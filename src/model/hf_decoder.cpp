// Llama 3 / Qwen2 / Qwen3 / Gemma 3 directories (attn/hf_decoder.h): the
// weights from one safetensors file or the shards of an index, read and
// written (config.json and generation_config.json: hf_decoder_config.cpp).
#include "attn/hf_decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

#include "attn/atomic_file.h"
#include "attn/bfloat16.h"
#include "attn/read_file.h"
#include "attn/safetensors.h"
#include "attn/utf8.h"
#include "model/hf_json.h"

namespace attn::io {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using hf::named;

// model.safetensors.index.json: a regular file of at most 64 MiB (the Hub's
// are tens of kB).
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

}  // namespace

namespace {

// The feed-forward's names: attn's (the book's) and transformers'.
constexpr std::pair<const char*, const char*> kFeedForwardNames[] = {
    {".mlp.fc1.", ".mlp.gate_proj."},
    {".mlp.fc2.", ".mlp.up_proj."},
    {".mlp.fc3.", ".mlp.down_proj."}};

// name with the first of kFeedForwardNames' `from` sides it holds replaced by the other side.
std::string renamed(const std::string& name, bool to_hf) {
  for (const auto& [attn_part, hf_part] : kFeedForwardNames) {
    const char* from = to_hf ? attn_part : hf_part;
    const char* to = to_hf ? hf_part : attn_part;
    const size_t at = name.find(from);
    if (at != std::string::npos)
      return name.substr(0, at) + to + name.substr(at + std::strlen(from));
  }
  return name;
}

}  // namespace

std::string hf_decoder_name(const std::string& attn_name) { return renamed(attn_name, true); }

std::string attn_decoder_name(const std::string& hf_name) { return renamed(hf_name, false); }

std::vector<std::string> hf_decoder_weight_files(const std::string& dir,
                                                 std::map<std::string, std::string>* weight_map) {
  const fs::path d(dir);
  std::vector<std::string> out;
  if (fs::is_regular_file(d / "model.safetensors")) {
    out.push_back((d / "model.safetensors").string());
    return out;
  }
  if (!fs::is_regular_file(d / "model.safetensors.index.json")) {
    throw std::invalid_argument(fmt::format(
        "{} has neither model.safetensors nor model.safetensors.index.json", named(dir)));
  }
  const std::string index = (d / "model.safetensors.index.json").string();
  const Json j = hf::parse_json_object(read_file(index, kMaxIndexBytes), index);
  if (!j.contains("weight_map") || !j.at("weight_map").is_object()) {
    throw std::invalid_argument(fmt::format("{}: no \"weight_map\" object", named(index)));
  }
  std::set<std::string> files;
  for (const auto& [name, file] : j.at("weight_map").items()) {
    if (!file.is_string()) {
      throw std::invalid_argument(fmt::format("{}: the file of {} must be a string, got {}",
                                              named(index), named(name),
                                              printable(file.dump(), 200)));
    }
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos ||
        f == "." || f == ".." || f.find('\0') != std::string::npos) {
      throw std::invalid_argument(
          fmt::format("{}: shard {} of {} is not a file name inside the directory", named(index),
                      named(f), named(name)));
    }
    if (weight_map) (*weight_map)[name] = f;
    files.insert(f);
  }
  for (const std::string& f : files) out.push_back((d / f).string());
  return out;
}

HfDecoderInfo load_hf_decoder(const std::string& dir, std::unique_ptr<nn::DecoderLM>& model,
                              DType dtype, bool in_place_weights) {
  if (dtype != DType::kFloat32 && dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format(
        "load_hf_decoder: dtype must be float32 or bfloat16, got {}", dtype_name(dtype)));
  }
  HfDecoderInfo info;
  info.hf = read_hf_decoder_config(dir);
  const fs::path d(dir);

  std::map<std::string, std::string> weight_map;  // tensor -> file (sharded)
  info.weight_files = hf_decoder_weight_files(dir, &weight_map);

  std::vector<std::shared_ptr<MappedSafetensors>> maps;
  std::map<std::string, std::pair<const MappedSafetensors*, const SafetensorsEntry*>> tensors;
  std::set<std::string> dtypes;
  for (const std::string& path : info.weight_files) {
    maps.push_back(std::make_shared<MappedSafetensors>(path, /*copy_on_write=*/true));
    const std::string base = fs::path(path).filename().string();
    for (const SafetensorsEntry& e : maps.back()->header().entries) {
      if (!weight_map.empty()) {
        const auto it = weight_map.find(e.name);
        if (it == weight_map.end() || it->second != base) {
          throw std::invalid_argument(fmt::format(
              "{}: holds {}, which the index does not place there", named(path), named(e.name)));
        }
      }
      if (!tensors.emplace(e.name, std::make_pair(maps.back().get(), &e)).second) {
        throw std::invalid_argument(
            fmt::format("{}: {} is stored twice", named(path), named(e.name)));
      }
    }
  }
  for (const auto& [name, file] : weight_map) {
    if (!tensors.count(name)) {
      throw std::invalid_argument(fmt::format("{}: the index places {} there, but it is not in it",
                                              named((d / file).string()), named(name)));
    }
  }

  // Each layer has several weights: a config naming more layers than the files
  // hold tensors is refused before the model's per-layer structures are built.
  if (info.hf.config.num_layers > static_cast<int64_t>(tensors.size())) {
    throw std::invalid_argument(
        fmt::format("{}: config.json has {} layers, but the weights hold only {} tensors",
                    named(dir), info.hf.config.num_layers, tensors.size()));
  }
  {
    const nn::NoInitScope no_init;  // every weight comes from the files (checked below)
    model = std::make_unique<nn::DecoderLM>(info.hf.config);
  }
  std::map<const MappedSafetensors*, std::shared_ptr<MappedSafetensors>> maps_by_ptr;
  for (const auto& m : maps) maps_by_ptr[m.get()] = m;
  std::set<std::string> used;
  for (auto& [attn_name, param] : model->named_parameters()) {
    const std::string name = hf_decoder_name(attn_name);
    const auto it = tensors.find(name);
    if (it == tensors.end()) {
      throw std::invalid_argument(
          fmt::format("{}: no tensor {}, which a {} with this config.json has", named(dir),
                      named(name), info.hf.model_type));
    }
    const auto& [map, e] = it->second;
    if (e->shape != param->value.shape()) {
      throw std::invalid_argument(fmt::format("{}: {} is {}, config.json makes it {}",
                                              named(map->path()), named(name), shape_str(e->shape),
                                              shape_str(param->value.shape())));
    }
    // Read in place where the file holds the compute dtype (F32, or BF16 for a
    // bf16 matrix): the tensor views the private mapping, which stays while
    // any such tensor lives (a page written becomes the process's own).
    const bool bf16_matrix = dtype == DType::kBFloat16 && param->value.dim() == 2;
    const DType want = bf16_matrix ? DType::kBFloat16 : DType::kFloat32;
    std::byte* in_place = map->mutable_data(*e);
    const auto align = static_cast<uintptr_t>(element_size(want));
    if (in_place_weights && e->dtype == safetensors_dtype_name(want) && in_place != nullptr &&
        reinterpret_cast<uintptr_t>(in_place) % align == 0 && e->nbytes() > 0) {
      const std::shared_ptr<MappedSafetensors> owner = maps_by_ptr.at(map);
      param->value = Tensor::wrap(owner, in_place, e->shape, want);
      ++info.mapped;
    } else {
      if (bf16_matrix) {  // a matrix, kept bf16
        param->value = Tensor::empty(e->shape, DType::kBFloat16);
        map->read_bfloat16(*e, reinterpret_cast<uint16_t*>(param->value.data_ptr<BFloat16>()));
      } else {
        map->read_float32(*e, param->value.data());
      }
      map->release(*e);  // the file's pages leave this process once copied
    }
    dtypes.insert(e->dtype);
    used.insert(name);
    ++info.tensors;
  }
  for (const auto& [name, where] : tensors) {
    if (used.count(name)) continue;
    const bool tied_head = name == "lm_head.weight" && info.hf.config.tie_embeddings;
    if (tied_head || name.ends_with(".rotary_emb.inv_freq")) {
      ++info.ignored;
      continue;
    }
    throw std::invalid_argument(
        fmt::format("{}: unknown tensor {} for a {} (attn reads transformers' "
                    "names: model.embed_tokens, model.layers.N..., model.norm, lm_head)",
                    named(where.first->path()), named(name), info.hf.model_type));
  }
  info.file_dtype = dtypes.size() == 1 ? *dtypes.begin() : "mixed";
  if (info.hf.config.tie_embeddings) {  // the head views the embedding's new value
    nn::tie(model->lm_head.weight, model->model.embed_tokens.weight);
  }
  model->eval();
  return info;
}

void save_hf_decoder(nn::DecoderLM& model, const HfDecoderConfig& hf, const std::string& dir,
                     const HfDecoderSaveOptions& options) {
  if (options.dtype != DType::kFloat32 && options.dtype != DType::kBFloat16) {
    throw std::invalid_argument(fmt::format(
        "save_hf_decoder: dtype must be float32 or bfloat16, got {}", dtype_name(options.dtype)));
  }
  HfDecoderConfig out = hf;
  out.config = model.config();
  const std::string config =
      hf_decoder_config_json(out, options.dtype == DType::kBFloat16 ? "bfloat16" : "float32");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (auto& [name, param] : model.named_parameters())  // a tied head is not a parameter of its own
    tensors.emplace_back(hf_decoder_name(name), param->value.to(options.dtype));
  Json gen = Json::object();
  if (hf.bos_token_id) gen["bos_token_id"] = *hf.bos_token_id;
  if (hf.eos_token_ids.size() == 1) {
    gen["eos_token_id"] = hf.eos_token_ids[0];
  } else if (!hf.eos_token_ids.empty()) {
    gen["eos_token_id"] = hf.eos_token_ids;
  }
  if (out.config.pad_token_id >= 0) gen["pad_token_id"] = out.config.pad_token_id;

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw std::runtime_error(
        fmt::format("save_hf_decoder: cannot make {}: {}", named(dir), ec.message()));
  }
  const fs::path d(dir);
  write_safetensors((d / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_atomically((d / "config.json").string(), config);
  write_file_atomically((d / "generation_config.json").string(), gen.dump(2) + "\n");
  if (!options.tokenizer_json.empty())
    write_file_atomically((d / "tokenizer.json").string(), options.tokenizer_json);
  if (!options.tokenizer_config_json.empty())
    write_file_atomically((d / "tokenizer_config.json").string(), options.tokenizer_config_json);
}

}  // namespace attn::io
