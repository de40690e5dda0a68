// Reading a GPT checkpoint directory (attn/checkpoint.h): the metadata
// (checkpoint_metadata.cpp), then the weights into a new model.
#include "attn/checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <stdexcept>

#include "attn/random.h"
#include "attn/safetensors.h"
#include "attn/state_dict.h"
#include "attn/utf8.h"

namespace attn::nn {
namespace {

// A model of `config` and `options` with the file's weights; optim.* tensors ignored.
void load_weights(const std::string& path, const io::SafetensorsFile& file, const GPTConfig& config,
                  const GPTOptions& options, std::unique_ptr<GPTModel>& model) {
  try {
    // Every weight is replaced by the file's: draw the initial ones from a
    // generator of their own, leaving the default generator as it was.
    Generator scratch;
    model = std::make_unique<GPTModel>(config, options, scratch);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(
        fmt::format("'{}': bad config: {}", printable(path), printable(e.what())));
  }
  const io::LoadResult r = io::load_state_dict(*model, file, /*strict=*/false);
  std::vector<std::string> unexpected;
  for (const auto& name : r.unexpected) {
    if (name.rfind("optim.", 0) != 0) unexpected.push_back(name);
  }
  if (!r.missing.empty()) {
    throw std::invalid_argument(fmt::format("'{}': {} of the model's tensors missing, first '{}'",
                                            printable(path), r.missing.size(),
                                            printable(r.missing.front())));
  }
  if (!unexpected.empty()) {
    throw std::invalid_argument(
        fmt::format("'{}': {} tensor(s) the model does not have, first '{}'", printable(path),
                    unexpected.size(), printable(unexpected.front())));
  }
  model->eval();
}

}  // namespace

Checkpoint load_checkpoint(const std::string& dir, std::unique_ptr<GPTModel>& model,
                           const GPTOptions& options) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) {
    throw std::invalid_argument(
        fmt::format("checkpoint directory '{}' does not exist", printable(dir)));
  }
  const std::string path = (fs::path(dir) / "checkpoint.safetensors").string();
  if (!fs::exists(path)) {
    throw std::invalid_argument(
        fmt::format("'{}' does not exist (a checkpoint directory holds "
                    "checkpoint.safetensors)",
                    printable(path)));
  }
  const io::SafetensorsFile file = io::read_safetensors(path);
  Checkpoint ck = read_checkpoint_metadata(file.metadata, path);
  load_weights(path, file, ck.config, options, model);
  return ck;
}

}  // namespace attn::nn
