// src/text/sentencepiece_proto.h - the two flags of a SentencePiece model's
// normalizer that transformers' converted Llama tokenizers treat differently,
// read and rewritten in the ModelProto's protobuf wire format (Debian's
// libsentencepiece installs no .pb.h; the format is small):
//   ModelProto     { pieces = 1; trainer_spec = 2; normalizer_spec = 3; ... }
//   NormalizerSpec { name = 1; precompiled_charsmap = 2; add_dummy_prefix = 3
//                    [default true]; remove_extra_whitespaces = 4 [default true];
//                    escape_whitespaces = 5; normalization_rule_tsv = 6 }
#pragma once

#include <string>
#include <string_view>

namespace attn::text {

struct SentencePieceNormalizerFlags {
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
};

// The model's flags (protobuf's defaults where the proto leaves them out).
// Throws std::invalid_argument naming `name` on a malformed message.
SentencePieceNormalizerFlags sentencepiece_normalizer_flags(std::string_view model,
                                                            const std::string& name);

// The same model with add_dummy_prefix and remove_extra_whitespaces false, every
// other field as it was.
std::string sentencepiece_without_dummy_prefix(std::string_view model, const std::string& name);

}  // namespace attn::text
