// input_file.cpp - reading a command's input file (input_file.h).
#include "input_file.h"

#include <stdexcept>

#include "attn/read_file.h"

namespace attn::cli {

std::string read_input_file(const std::string& path, const std::string& flag, uint64_t max_bytes) {
  try {
    return attn::read_file(path, max_bytes);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(flag + " " + e.what());  // "--text 'PATH' is a directory, ..."
  }
}

}  // namespace attn::cli
