// GPT-2's encoder.json and vocab.bpe, embedded in the library at build time
// (gpt2_data.h). The assembler copies the files named by CMake
// (ATTN_GPT2_ENCODER_JSON, ATTN_GPT2_VOCAB_BPE: absolute paths under data/gpt2)
// into .rodata with .incbin, so the build neither converts nor compiles 1.9 MB
// of generated source.
#include "text/gpt2_data.h"

#ifndef ATTN_GPT2_ENCODER_JSON
#error "ATTN_GPT2_ENCODER_JSON must name data/gpt2/encoder.json (set by CMakeLists.txt)"
#endif
#ifndef ATTN_GPT2_VOCAB_BPE
#error "ATTN_GPT2_VOCAB_BPE must name data/gpt2/vocab.bpe (set by CMakeLists.txt)"
#endif

// clang-format off
#define ATTN_INCBIN(name, path)                                  \
  __asm__(".section .rodata\n"                                    \
          ".balign 16\n"                                          \
          ".type attn_incbin_" #name ", @object\n"                \
          "attn_incbin_" #name ":\n"                              \
          ".incbin \"" path "\"\n"                                \
          "attn_incbin_" #name "_end:\n"                          \
          ".byte 0\n"                                             \
          ".previous\n");                                         \
  extern "C" const char attn_incbin_##name[];                     \
  extern "C" const char attn_incbin_##name##_end[];
// clang-format on

ATTN_INCBIN(gpt2_encoder_json, ATTN_GPT2_ENCODER_JSON)
ATTN_INCBIN(gpt2_vocab_bpe, ATTN_GPT2_VOCAB_BPE)

namespace attn::text {

std::string_view gpt2_encoder_json() {
  return {attn_incbin_gpt2_encoder_json,
          static_cast<size_t>(attn_incbin_gpt2_encoder_json_end - attn_incbin_gpt2_encoder_json)};
}

std::string_view gpt2_vocab_bpe() {
  return {attn_incbin_gpt2_vocab_bpe,
          static_cast<size_t>(attn_incbin_gpt2_vocab_bpe_end - attn_incbin_gpt2_vocab_bpe)};
}

}  // namespace attn::text
