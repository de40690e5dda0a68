// attn/state_dict.h - a module's weights in and out of a safetensors file.
//
// save_state_dict writes a module's state_dict() (parameters and persistent
// buffers by their PyTorch names; a tied parameter once, under its first name)
// with write_safetensors (attn/safetensors.h); load_state_dict copies a file's
// tensors into a module by name, checking dtype and shape, and lists the
// missing and unexpected names, as PyTorch's Module.load_state_dict does.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "attn/nn.h"
#include "attn/safetensors.h"

namespace attn::io {

// PyTorch's load_state_dict result: state_dict() names the file lacks, and
// file names the module does not have (sorted).
struct LoadResult {
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
};

// Copies the file's tensors into the module's parameters and persistent
// buffers (module.state_dict()) by name. Every name present on both sides must
// agree in dtype and shape (std::invalid_argument naming the file, the tensor
// and both values, otherwise). strict: missing or unexpected names are an
// error (std::invalid_argument listing them); not strict: they are returned.
// A name missing from the file is not missing when it is a tied parameter whose
// other name is in the file. Nothing is written unless every check passes.
LoadResult load_state_dict(nn::Module& module, const SafetensorsFile& file, bool strict = true);
LoadResult load_state_dict(nn::Module& module, const std::string& path, bool strict = true);
// Writes module.state_dict() to path (write_safetensors); a tied parameter is
// written once, under its first name.
void save_state_dict(nn::Module& module, const std::string& path,
                     const std::map<std::string, std::string>& metadata = {});

}  // namespace attn::io
