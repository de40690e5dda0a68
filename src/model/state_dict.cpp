// Modules in and out of safetensors files: load_state_dict and save_state_dict
// (attn/state_dict.h) over Module::state_dict().
#include "attn/state_dict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "attn/nn.h"
#include "attn/safetensors.h"
#include "attn/utf8.h"

namespace attn::io {

namespace {

// The same tensor (one parameter under two names, as tie() makes).
bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shares_storage_with(b) && a.storage_offset() == b.storage_offset() &&
         a.shape() == b.shape() && a.strides() == b.strides() && a.dtype() == b.dtype();
}

std::string file_name(const SafetensorsFile& file) {
  return file.path.empty() ? "<memory>" : file.path;
}

std::string name_list(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

LoadResult load_state_dict(nn::Module& module, const SafetensorsFile& file, bool strict) {
  const std::string fname = file_name(file);
  std::map<std::string, const Tensor*> in_file;
  for (const auto& [name, t] : file.tensors) {
    if (!in_file.emplace(name, &t).second) {
      throw std::invalid_argument(
          fmt::format("load_state_dict: '{}' holds the tensor '{}' twice", printable(fname), printable(name)));
    }
  }

  const auto target = module.state_dict();  // handles on the module's storage
  LoadResult result;
  std::set<std::string> target_names;
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // (module tensor, file tensor)
  for (const auto& [name, dst] : target) {
    target_names.insert(name);
    const auto found = in_file.find(name);
    if (found == in_file.end()) {
      // A tied parameter is loaded through whichever of its names the file has.
      const bool tied_in_file = std::any_of(target.begin(), target.end(), [&](const auto& other) {
        return other.first != name && same_tensor(other.second, dst) &&
               in_file.count(other.first) > 0;
      });
      if (!tied_in_file) result.missing.push_back(name);
      continue;
    }
    const Tensor& src = *found->second;
    if (src.dtype() != dst.dtype()) {
      throw std::invalid_argument(
          fmt::format("load_state_dict: '{}': tensor '{}' has dtype {} but the module's is {}",
                      printable(fname), printable(name), dtype_name(src.dtype()), dtype_name(dst.dtype())));
    }
    if (src.shape() != dst.shape()) {
      throw std::invalid_argument(
          fmt::format("load_state_dict: '{}': tensor '{}' has shape {} but the module's is {}",
                      printable(fname), printable(name), shape_str(src.shape()), shape_str(dst.shape())));
    }
    copies.emplace_back(dst, &src);
  }
  for (const auto& [name, t] : in_file) {
    if (target_names.count(name) == 0) result.unexpected.push_back(name);
  }
  std::sort(result.missing.begin(), result.missing.end());

  if (strict && (!result.missing.empty() || !result.unexpected.empty())) {
    std::string what;
    if (!result.unexpected.empty()) {
      what += fmt::format("{} tensor(s) the module does not have: {}", result.unexpected.size(),
                          name_list(result.unexpected));
    }
    if (!result.missing.empty()) {
      what +=
          fmt::format("{}{} of the module's tensor(s) missing from the file: {}",
                      what.empty() ? "" : "; ", result.missing.size(), name_list(result.missing));
    }
    throw std::invalid_argument(
        fmt::format("load_state_dict: '{}': {}", printable(fname), printable(what, 4096)));
  }
  for (auto& [dst, src] : copies) dst.copy_(*src);
  return result;
}

LoadResult load_state_dict(nn::Module& module, const std::string& path, bool strict) {
  return load_state_dict(module, read_safetensors(path), strict);
}

void save_state_dict(nn::Module& module, const std::string& path,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, Tensor>> unique;
  for (auto& [name, t] : module.state_dict()) {
    const bool seen = std::any_of(unique.begin(), unique.end(),
                                  [&](const auto& u) { return same_tensor(u.second, t); });
    if (!seen) unique.emplace_back(name, t);
  }
  write_safetensors(path, unique, metadata);
}

}  // namespace attn::io
