// src/text/sentencepiece_proto.cpp - see sentencepiece_proto.h.
#include "text/sentencepiece_proto.h"

#include <fmt/format.h>

#include <cstdint>
#include <stdexcept>

namespace attn::text {
namespace {

constexpr int kNormalizerSpec = 3, kAddDummyPrefix = 3, kRemoveExtraWhitespaces = 4;

// One field of a message: its number, wire type, and its bytes (the whole
// field, tag included) and payload (a varint's value, a length-delimited
// field's contents).
struct Field {
  uint32_t number = 0, wire = 0;
  std::string_view whole, contents;
  uint64_t value = 0;
};

class Reader {
 public:
  Reader(std::string_view bytes, const std::string& name) : s_(bytes), name_(name) {}
  bool done() const { return at_ == s_.size(); }
  Field next() {
    const size_t start = at_;
    const uint64_t tag = varint();
    Field f;
    f.number = uint32_t(tag >> 3), f.wire = uint32_t(tag & 7);
    switch (f.wire) {
      case 0:
        f.value = varint();
        break;
      case 1:
        skip(8);
        break;
      case 5:
        skip(4);
        break;
      case 2: {
        const uint64_t n = varint();
        if (n > s_.size() - at_) fail("a field runs past the end");
        f.contents = s_.substr(at_, size_t(n));
        at_ += size_t(n);
        break;
      }
      default:
        fail(fmt::format("wire type {}", f.wire));
    }
    if (f.number == 0) fail("field number 0");
    f.whole = s_.substr(start, at_ - start);
    return f;
  }

 private:
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (at_ == s_.size()) fail("a varint runs past the end");
      const auto b = static_cast<unsigned char>(s_[at_++]);
      v |= uint64_t(b & 0x7F) << shift;
      if ((b & 0x80) == 0) return v;
    }
    fail("a varint longer than 10 bytes");
  }
  void skip(size_t n) {
    if (n > s_.size() - at_) fail("a field runs past the end");
    at_ += n;
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw std::invalid_argument(
        fmt::format("tokenizer {}: not a SentencePiece model ({} at byte {})", name_, why, at_));
  }
  std::string_view s_;
  const std::string& name_;
  size_t at_ = 0;
};

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

// The normalizer_spec message's bytes (empty when the model has none).
std::string_view normalizer_spec(std::string_view model, const std::string& name) {
  std::string_view spec;
  for (Reader r(model, name); !r.done();) {
    const Field f = r.next();
    if (f.number == kNormalizerSpec && f.wire == 2) spec = f.contents;  // the last one wins
  }
  return spec;
}

}  // namespace

SentencePieceNormalizerFlags sentencepiece_normalizer_flags(std::string_view model,
                                                            const std::string& name) {
  SentencePieceNormalizerFlags flags;
  for (Reader r(normalizer_spec(model, name), name); !r.done();) {
    const Field f = r.next();
    if (f.wire != 0) continue;
    if (f.number == kAddDummyPrefix) flags.add_dummy_prefix = f.value != 0;
    if (f.number == kRemoveExtraWhitespaces) flags.remove_extra_whitespaces = f.value != 0;
  }
  return flags;
}

std::string sentencepiece_without_dummy_prefix(std::string_view model, const std::string& name) {
  std::string spec;  // the normalizer_spec without the two flags, then both false
  for (Reader r(normalizer_spec(model, name), name); !r.done();) {
    const Field f = r.next();
    if (f.number != kAddDummyPrefix && f.number != kRemoveExtraWhitespaces) spec += f.whole;
  }
  for (const int number : {kAddDummyPrefix, kRemoveExtraWhitespaces}) {
    put_varint(spec, uint64_t(number) << 3);  // wire type 0
    put_varint(spec, 0);
  }
  std::string out;
  for (Reader r(model, name); !r.done();) {
    const Field f = r.next();
    if (f.number != kNormalizerSpec) out += f.whole;
  }
  put_varint(out, (uint64_t(kNormalizerSpec) << 3) | 2);
  put_varint(out, spec.size());
  out += spec;
  return out;
}

}  // namespace attn::text
