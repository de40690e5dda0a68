// `attn inspect FILE` (inspect.h).
#include "inspect.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace attn::cli {

namespace {

// A name or metadata string as printed: as it is when it is plain text, else
// JSON-quoted, so that control characters and escape sequences stay inert.
std::string printable(const std::string& s) {
  const bool plain = !s.empty() && std::none_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7F || c == ' ';
  });
  return plain ? s : nlohmann::json(s).dump();
}

}  // namespace

std::string inspect_text(const std::string& path, const io::SafetensorsHeader& header) {
  int64_t elements = 0;
  for (const auto& e : header.entries) elements += e.nbytes() / e.element_size;
  std::string out =
      fmt::format("{}: {} tensors, {} elements; {} bytes of header, {} bytes of data\n", path,
                  header.entries.size(), elements, header.header_bytes, header.data_bytes);
  std::vector<std::vector<std::string>> rows = {
      {"name", "dtype", "shape", "bytes", "data_offsets"}};
  for (const auto& e : header.entries) {
    rows.push_back({printable(e.name), e.dtype, shape_str(e.shape), std::to_string(e.nbytes()),
                    fmt::format("[{}, {})", e.begin, e.end)});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      // Numbers right-aligned, text left-aligned; no trailing spaces.
      const bool right = c == 3;
      const std::string cell = right ? fmt::format("{:>{}}", row[c], width[c]) : row[c];
      line += (c == 0 ? "" : "  ") + cell;
      if (!right && c + 1 < row.size()) line.append(width[c] - row[c].size(), ' ');
    }
    out += line + "\n";
  }
  out += fmt::format("metadata: {}\n", header.metadata.empty()
                                           ? "(none)"
                                           : std::to_string(header.metadata.size()) + " entries");
  for (const auto& [key, value] : header.metadata)
    out += fmt::format("  {}: {}\n", printable(key), printable(value));
  return out;
}

std::string inspect_json(const std::string& path, const io::SafetensorsHeader& header) {
  nlohmann::ordered_json j;
  j["file"] = path;
  j["header_bytes"] = header.header_bytes;
  j["data_bytes"] = header.data_bytes;
  j["tensors"] = nlohmann::ordered_json::array();
  for (const auto& e : header.entries) {
    j["tensors"].push_back({{"name", e.name},
                            {"dtype", e.dtype},
                            {"shape", e.shape},
                            {"bytes", e.nbytes()},
                            {"data_offsets", {e.begin, e.end}}});
  }
  j["metadata"] = header.metadata;
  return j.dump(2) + "\n";
}

Command add_inspect_command(CLI::App& app) {
  struct Flags {
    std::string file;
    bool json = false;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "inspect",
      "List a safetensors file's tensors (name, dtype, shape, bytes) and metadata, after checking "
      "every offset, size, dtype and shape in its header against the file");
  cmd->footer(
      "Examples:\n  attn inspect model.safetensors\n  attn inspect --json model.safetensors");
  cmd->add_option("file", flags->file, "The safetensors file")->required()->type_name("FILE");
  cmd->add_flag("--json", flags->json, "Print one JSON object instead of the table");
  auto run = [flags]() -> int {
    const io::SafetensorsHeader header = io::read_safetensors_header(flags->file);
    std::cout << (flags->json ? inspect_json(flags->file, header)
                              : inspect_text(flags->file, header));
    std::cout.flush();
    return std::cout ? 0 : 1;
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
