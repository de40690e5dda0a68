// An attn checkpoint's metadata (nn::read_checkpoint_metadata,
// src/model/checkpoint_metadata.cpp): what it reads, and a table of hostile
// metadata (issue 46), each refused by std::invalid_argument naming the key
// with no raw byte; among them the findings of fuzz_checkpoint_metadata.
#include <gtest/gtest.h>

#include <map>
#include <stdexcept>
#include <string>

#include "attn/checkpoint.h"
#include "attn/model_config.h"

namespace {

using Metadata = std::map<std::string, std::string>;

const std::string kConfig =
    R"({"vocab_size": 3, "context_length": 16, "emb_dim": 8, "n_heads": 2, "n_layers": 1, "drop_rate": 0.0, "qkv_bias": false})";

Metadata char_checkpoint() {
  return {{"format", "attn-checkpoint-1"},
          {"config", kConfig},
          {"tokenizer", "char"},
          {"vocab", R"(["a", "\u00e9", "\n"])"}};
}

TEST(CheckpointMetadata, ReadsACharAndAGpt2Checkpoint) {
  const auto ck = attn::nn::read_checkpoint_metadata(char_checkpoint(), "ck.safetensors");
  EXPECT_EQ(ck.tokenizer, "char");
  EXPECT_EQ(ck.vocab, (std::vector<std::string>{"a", "\xC3\xA9", "\n"}));
  EXPECT_EQ(ck.config.vocab_size, 3);
  Metadata gpt2 = char_checkpoint();
  gpt2["tokenizer"] = "gpt2";
  gpt2.erase("vocab");
  EXPECT_EQ(attn::nn::read_checkpoint_metadata(gpt2, "ck.safetensors").tokenizer, "gpt2");
}

TEST(CheckpointMetadata, HostileMetadataIsRefusedNamingTheKey) {
  struct Case {
    std::string key, value, needle;
  };
  const std::vector<Case> cases = {
      {"format", "attn-checkpoint-2", "metadata \"format\" is \"attn-checkpoint-2\""},
      // Raw bytes of the file are escaped, not echoed (the format was once printed raw).
      {"format", "\x1b[31m\xff", "metadata \"format\" is \"\\x1B[31m\\xFF\""},
      {"config", "{", "metadata \"config\" is not valid JSON"},
      {"config", "[]", "metadata \"config\" is not a JSON object"},
      {"config", R"({"vocab_size": 3})", "metadata \"config\" lacks \"context_length\""},
      {"config",
       R"({"vocab_size": 3, "context_length": 16, "emb_dim": 8, "n_heads": 2, "n_layers": 100000000, "drop_rate": 0.0, "qkv_bias": false})",
       "\"n_layers\" must be at most 4096, got 100000000"},
      // fuzz_checkpoint_metadata's finding: a number past a double's range made
      // nlohmann throw out_of_range (not a parse_error), which escaped as
      // another exception type.
      {"config",
       R"({"vocab_size": 3, "context_length": 16, "emb_dim": 8, "n_heads": 2, "n_layers": 1e+390000, "drop_rate": 0.0, "qkv_bias": false})",
       "metadata \"config\" is not valid JSON"},
      {"vocab", "[1e400]", "metadata \"vocab\" is not valid JSON"},
      {"tokenizer", "bpe", "metadata \"tokenizer\" is \"bpe\""},
      {"vocab", R"(["a", "b"])", "vocab has 2 tokens but config vocab_size is 3"},
      {"vocab", R"(["a", "bc", "d"])", "vocab entry \"bc\" is not a one-character string"},
      {"vocab", R"(["a", "a", "b"])", "vocab entry 1 (\"a\") repeats entry 0"},
      {"vocab", "{}", "metadata \"vocab\" is not a JSON array"},
  };
  for (const Case& c : cases) {
    Metadata m = char_checkpoint();
    m[c.key] = c.value;
    try {
      (void)attn::nn::read_checkpoint_metadata(m, "ck.safetensors");
      ADD_FAILURE() << "accepted " << c.key << " = " << c.value;
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("'ck.safetensors': "), std::string::npos) << message;
      EXPECT_NE(message.find(c.needle), std::string::npos) << c.needle << " not in: " << message;
      EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
    }
  }
  for (const char* key : {"format", "config", "vocab"}) {
    Metadata m = char_checkpoint();
    m.erase(key);
    EXPECT_THROW((void)attn::nn::read_checkpoint_metadata(m, "ck.safetensors"),
                 std::invalid_argument)
        << key;
  }
}

}  // namespace
