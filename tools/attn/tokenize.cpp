// `attn tokenize` (tokenize.h).
#include "tokenize.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "attn/read_file.h"
#include "attn/utf8.h"
#include "flag_checks.h"
#include "hf_text.h"
#include "input_file.h"
#include "special_tokens.h"

namespace attn::cli {

namespace {

std::string read_input(const std::string& file) {
  if (file.empty()) return read_stream(STDIN_FILENO, "standard input", kMaxInputBytes);
  return read_input_file(file, "--file");
}

bool valid_utf8(const std::string& s) {
  try {
    decode_utf8(s);
    return true;
  } catch (const std::invalid_argument&) {
    return false;
  }
}

// GPT-2's byte-to-unicode form of a token's bytes ("Ġworld"): '!'..'~',
// '¡'..'¬', '®'..'ÿ' as themselves, the other bytes as U+0100 onward.
std::string unicode_form(std::string_view bytes) {
  std::string s;
  for (char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    const bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    char32_t cp = b;
    if (!self) {
      cp = 256;  // the n-th byte outside those ranges is U+0100 + n
      for (int k = 0; k < b; ++k) {
        if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || k >= 0xAE)) ++cp;
      }
    }
    s += encode_utf8(cp);
  }
  return s;
}

}  // namespace

std::string tokens_json(const text::Tokenizer& tok, const std::vector<int64_t>& ids) {
  nlohmann::ordered_json j;
  j["ids"] = ids;
  j["tokens"] = nlohmann::ordered_json::array();
  for (int64_t id : ids) {
    const std::string& bytes = tok.token_bytes(id);
    nlohmann::ordered_json t;
    t["id"] = id;
    t["token"] = unicode_form(bytes);
    t["text"] = valid_utf8(bytes) ? nlohmann::ordered_json(bytes) : nlohmann::ordered_json(nullptr);
    j["tokens"].push_back(t);
  }
  return j.dump() + "\n";
}

std::vector<int64_t> parse_ids(std::string_view text) {
  std::vector<int64_t> ids;
  size_t i = 0;
  auto separator = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',';
  };
  // An enclosing [ ] (a JSON array of ids).
  const size_t first = text.find_first_not_of(" \t\r\n");
  const size_t last = text.find_last_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '[' && text[last] == ']')
    text = text.substr(first + 1, last - first - 1);
  while (i < text.size()) {
    if (separator(text[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && !separator(text[end])) ++end;
    const std::string_view word = text.substr(i, end - i);
    int64_t id = 0;
    const auto [ptr, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc() || ptr != word.data() + word.size())
      throw std::invalid_argument(
          fmt::format("'{}' is not a token id (an integer)", printable(word, 40)));
    ids.push_back(id);
    i = end;
  }
  return ids;
}

Command add_tokenize_command(CLI::App& app) {
  struct Flags {
    std::vector<std::string> args;
    std::string file;
    bool allow_special = false;
    bool json = false;
    bool decode = false;
    std::string tokenizer;
    bool no_special = false;
    bool skip_special = false;
    bool chat = false;  // the text as a user message in the directory's chat template
    std::optional<std::string> system;
    std::string chat_template_kwargs, chat_template_file;
  };
  auto flags = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "GPT-2's byte-level BPE tokenizer (the ids tiktoken's gpt2 encoding gives), or a Hugging "
      "Face tokenizer.json or tokenizer.model (--tokenizer: Llama 3, Qwen, Gemma): text to ids, or "
      "ids to text with --decode");
  cmd->footer(
      "Examples:\n"
      "  attn tokenize 'Hello, I am'              -> 15496 11 314 716\n"
      "  attn tokenize --json 'Hello, I am'\n"
      "  attn tokenize --file data/the-verdict.txt\n"
      "  attn tokenize --allow-special 'a<|endoftext|>b'   -> 64 50256 65\n"
      "  attn tokenize --decode 15496 11 314 716   -> Hello, I am\n"
      "  echo 'Hello' | attn tokenize\n"
      "  attn tokenize --tokenizer DIR 'Hello'     # DIR/tokenizer.json (Llama 3, Qwen, Gemma)\n"
      "  attn tokenize --tokenizer DIR/tokenizer.model 'Hello'   # SentencePiece or tiktoken "
      "ranks\n"
      "  attn tokenize --tokenizer DIR --chat --json 'Hello'   # the chat prompt's text and ids\n"
      "With neither TEXT/IDS nor --file, the input is read from stdin.");
  add_option(cmd, "args", flags->args,
             "The text (one argument; quote it), or the ids with --decode")
      ->type_name("TEXT|IDS...");
  add_option(cmd, "--file", flags->file, "Read the text (or the ids) from this file")
      ->type_name("FILE");
  cmd->add_flag("--allow-special", flags->allow_special,
                "Encode \"<|endoftext|>\" as the special token 50256 (else text holding it is "
                "refused, as tiktoken's encode refuses it)");
  cmd->add_flag("--json", flags->json, "Print the ids and each token's spelling and text as JSON");
  cmd->add_flag("--decode", flags->decode, "Turn ids into text");
  add_option(cmd, "--tokenizer", flags->tokenizer,
             "A Hugging Face tokenizer.json, a tokenizer.model (a SentencePiece model, or "
             "Llama 3's tiktoken ranks), or a model directory holding one, instead of GPT-2's "
             "(its added tokens are always matched, as tokenizers matches them)")
      ->type_name("FILE|DIR");
  cmd->add_flag("--no-special", flags->no_special,
                "With --tokenizer: without the special tokens its post-processor adds (a BOS)");
  cmd->add_flag("--skip-special", flags->skip_special,
                "With --tokenizer --decode: leave the special tokens out of the text");
  cmd->add_flag("--chat", flags->chat,
                "With --tokenizer DIR: the text as the user's message in DIR's chat template "
                "(as attn generate --chat renders it), encoded without the post-processor; --json "
                "adds the rendered text");
  add_option(cmd, "--system", flags->system, "With --chat: a system message before the text")
      ->type_name("TEXT");
  add_option(cmd, "--chat-template-kwargs", flags->chat_template_kwargs,
             "With --chat: more template variables as a JSON object")
      ->type_name("JSON");
  add_option(cmd, "--chat-template", flags->chat_template_file,
             "With --chat: the template of FILE instead of DIR's")
      ->type_name("FILE");
  auto run = [flags]() -> int {
    if (!flags->chat && (flags->system || !flags->chat_template_kwargs.empty() ||
                         !flags->chat_template_file.empty())) {
      throw UsageError("--system, --chat-template-kwargs and --chat-template go with --chat");
    }
    if (flags->chat && (flags->tokenizer.empty() || flags->decode || flags->no_special)) {
      throw UsageError(
          "--chat goes with --tokenizer DIR, for encoding (the template writes its own BOS)");
    }
    if (!flags->args.empty() && !flags->file.empty())
      throw UsageError(flags->decode ? "give the ids as arguments or --file, not both"
                                     : "give the text as an argument or --file, not both");
    if (flags->tokenizer.empty() && (flags->no_special || flags->skip_special)) {
      throw UsageError("--no-special and --skip-special go with --tokenizer");
    }
    if (!flags->tokenizer.empty()) {
      if (flags->allow_special) {
        throw UsageError(
            "--allow-special is GPT-2's; a tokenizer.json's added tokens are always matched");
      }
      const text::HfTokenizer hf = load_hf_tokenizer(flags->tokenizer);
      if (flags->decode) {
        if (flags->json)
          throw UsageError("--json is for encoding; --decode writes the text itself");
        std::vector<int64_t> ids;
        try {
          for (const auto& a : flags->args) {
            for (int64_t id : parse_ids(a)) ids.push_back(id);
          }
          if (flags->args.empty()) ids = parse_ids(read_input(flags->file));
        } catch (const std::invalid_argument& e) {
          throw UsageError(e.what());
        }
        std::cout << hf.decode(ids, flags->skip_special);
        std::cout.flush();
        return std::cout ? 0 : 1;
      }
      if (flags->skip_special) throw UsageError("--skip-special goes with --decode");
      if (flags->args.size() > 1)
        throw UsageError(fmt::format("give the text as one argument (quote it); got {} arguments",
                                     flags->args.size()));
      std::string input = flags->args.empty() ? read_input(flags->file) : flags->args[0];
      if (flags->chat) {
        input = render_chat_prompt("tokenize", flags->tokenizer, flags->chat_template_file,
                                   flags->system, input, flags->chat_template_kwargs)
                    .text;
      }
      const std::vector<int64_t> ids = hf.encode(input, !flags->no_special && !flags->chat);
      if (flags->json) {
        nlohmann::ordered_json j;
        if (flags->chat) j["text"] = input;
        j["ids"] = ids;
        std::vector<std::string> tokens;
        for (const int64_t id : ids) tokens.push_back(hf.id_to_token(id));
        j["tokens"] = tokens;
        std::cout << j.dump() << '\n';
      } else {
        std::string line;
        for (size_t k = 0; k < ids.size(); ++k) line += (k ? " " : "") + std::to_string(ids[k]);
        std::cout << line << '\n';
      }
      std::cout.flush();
      return std::cout ? 0 : 1;
    }
    const text::Tokenizer& tok = text::Tokenizer::gpt2();
    if (flags->decode) {
      if (flags->json) throw UsageError("--json is for encoding; --decode writes the text itself");
      if (flags->allow_special)
        throw UsageError("--allow-special is for encoding; --decode writes every token's bytes");
      std::vector<int64_t> ids;
      if (!flags->args.empty()) {
        for (const auto& a : flags->args) {
          try {
            for (int64_t id : parse_ids(a)) ids.push_back(id);
          } catch (const std::invalid_argument& e) {
            throw UsageError(e.what());
          }
        }
      } else {
        ids = parse_ids(read_input(flags->file));
      }
      std::cout << tok.decode(ids);
      std::cout.flush();
      return std::cout ? 0 : 1;
    }
    if (flags->args.size() > 1)
      throw UsageError(fmt::format("give the text as one argument (quote it); got {} arguments",
                                   flags->args.size()));
    const std::string input = flags->args.empty() ? read_input(flags->file) : flags->args[0];
    refuse_special_tokens(
        input, flags->file.empty() ? "the text" : "--file '" + printable(flags->file) + "'",
        flags->allow_special);
    const std::vector<int64_t> ids = tok.encode_parallel(input, flags->allow_special);
    if (flags->json) {
      std::cout << tokens_json(tok, ids);
    } else {
      std::string line;
      line.reserve(ids.size() * 6);
      for (size_t k = 0; k < ids.size(); ++k) {
        if (k > 0) line += ' ';
        line += std::to_string(ids[k]);
      }
      std::cout << line << '\n';
    }
    std::cout.flush();
    return std::cout ? 0 : 1;
  };
  return Command{cmd, run};
}

}  // namespace attn::cli
