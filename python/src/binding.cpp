// binding.cpp - attn._attn, the extension module under the Python package attn
// (python/attn/__init__.py is the public API; docs/python.md).
//
// No PyTorch here: a tensor crosses as a "ref", the tuple
//   (data pointer, dtype name, sizes, strides in elements)
// that python/attn/_sdpa.py builds from a torch tensor (tensor.data_ptr(),
// tensor.size(), tensor.stride()), so the kernels read and write the caller's
// memory in place and one build serves every PyTorch version. The Python side
// checks shapes and dtypes first with PyTorch's messages; the library's
// strided entry points (attn/sdpa_strided.h), which every ref goes through,
// are the last line (a bad ref must never reach a kernel) and throw
// std::invalid_argument, which pybind11 raises as ValueError. The binding uses
// the public headers alone.
//
// The kernels run with the GIL released, on `threads` OpenMP threads (the
// caller's choice: torch.get_num_threads() unless attn.set_num_threads was
// called); the calling thread's OpenMP setting is restored afterwards, as it
// may be PyTorch's own (Debian's PyTorch shares this libgomp).
#include <omp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <exception>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "attn/attn.h"  // attn::version()
#include "attn/chat_template.h"
#include "attn/decoder.h"
#include "attn/hf_decoder.h"
#include "attn/hf_tokenizer.h"
#include "attn/kernels.h"
#include "attn/sdpa.h"
#include "attn/sdpa_strided.h"
#include "attn/tensor.h"
#include "attn/tokenizer.h"

namespace py = pybind11;

namespace {

constexpr const char* kWho = "attn._attn";

// (data pointer, dtype name, sizes, strides)
using Ref = std::tuple<uintptr_t, std::string, std::vector<int64_t>, std::vector<int64_t>>;

// A ref as the library's strided tensor (attn/sdpa_strided.h checks it).
attn::StridedTensor strided(const char* name, const Ref& r) {
  return {kWho, name, std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)};
}
std::optional<attn::StridedTensor> optional_strided(const char* name, const std::optional<Ref>& r) {
  if (!r) return std::nullopt;
  return strided(name, *r);
}
const attn::StridedTensor* ptr(const std::optional<attn::StridedTensor>& t) {
  return t ? &*t : nullptr;
}

// The Python call's options as attn's (checked by the library, as the C++
// entry points check them).
attn::SdpaOptions options_of(bool is_causal, bool bottom_right, std::optional<float> scale,
                             float softcap, int64_t window_left, int64_t window_right,
                             float dropout_p, uint64_t dropout_seed, bool enable_gqa) {
  attn::SdpaOptions o;
  o.is_causal = is_causal;
  o.causal_alignment =
      bottom_right ? attn::CausalAlignment::kBottomRight : attn::CausalAlignment::kTopLeft;
  o.scale = scale;
  o.softcap = softcap;
  o.window_left = window_left, o.window_right = window_right;
  o.dropout_p = dropout_p;
  o.dropout_seed = dropout_seed;
  o.enable_gqa = enable_gqa;
  return o;
}

// Runs f on `threads` OpenMP threads with the GIL released, then restores the
// calling thread's OpenMP setting.
template <class F>
void run(int threads, F&& f) {
  py::gil_scoped_release release;
  const int before = omp_get_max_threads();
  if (threads > 0) omp_set_num_threads(threads);
  try {
    f();
  } catch (...) {
    omp_set_num_threads(before);
    throw;
  }
  omp_set_num_threads(before);
}

}  // namespace

PYBIND11_MODULE(_attn, m) {
  m.doc() = "attn's kernels on raw tensor refs (python/attn is the API; docs/python.md)";
  // ATTN_SIMD_TARGET, ATTN_BF16_PATH and ATTN_GEMV_BF16_PATH force a path here
  // as in the attn CLI (docs/gemm.md); an unknown name fails the import with an
  // ImportError naming the valid ones.
  attn::kernels::apply_path_environment();

  m.def(
      "sdpa_forward",
      [](const Ref& q, const Ref& k, const Ref& v, const Ref& out, const Ref& lse,
         const std::optional<Ref>& mask, const std::optional<Ref>& alibi, bool is_causal,
         bool bottom_right, std::optional<float> scale, float softcap, int64_t window_left,
         int64_t window_right, float dropout_p, uint64_t dropout_seed, bool enable_gqa,
         int threads) {
        const attn::StridedTensor qs = strided("query", q), ks = strided("key", k),
                                  vs = strided("value", v), os = strided("out", out),
                                  ls = strided("lse", lse);
        const auto ms = optional_strided("attn_mask", mask);
        const auto as = optional_strided("alibi_slopes", alibi);
        const attn::SdpaOptions opt =
            options_of(is_causal, bottom_right, scale, softcap, window_left, window_right,
                       dropout_p, dropout_seed, enable_gqa);
        run(threads, [&] {
          attn::sdpa_forward_strided(kWho, qs, ks, vs, os, ls, ptr(ms), ptr(as), opt);
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("mask"),
      py::arg("alibi"), py::arg("is_causal"), py::arg("bottom_right"), py::arg("scale"),
      py::arg("softcap"), py::arg("window_left"), py::arg("window_right"), py::arg("dropout_p"),
      py::arg("dropout_seed"), py::arg("enable_gqa"), py::arg("threads"),
      "Writes out (B, Hq, Tq, Dv) and lse (B, Hq, Tq) in place: attn's fused sdpa kernel.");

  m.def(
      "sdpa_path",
      [](const Ref& q, const Ref& k, const Ref& v, const std::optional<Ref>& mask,
         const std::optional<Ref>& alibi, bool is_causal, bool bottom_right,
         std::optional<float> scale, float softcap, int64_t window_left, int64_t window_right,
         float dropout_p, uint64_t dropout_seed, bool enable_gqa) {
        const attn::StridedTensor qs = strided("query", q), ks = strided("key", k),
                                  vs = strided("value", v);
        const auto ms = optional_strided("attn_mask", mask);
        const auto as = optional_strided("alibi_slopes", alibi);
        const attn::SdpaOptions opt =
            options_of(is_causal, bottom_right, scale, softcap, window_left, window_right,
                       dropout_p, dropout_seed, enable_gqa);
        return attn::sdpa_path_strided(kWho, qs, ks, vs, ptr(ms), ptr(as), opt);
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("mask"), py::arg("alibi"),
      py::arg("is_causal"), py::arg("bottom_right"), py::arg("scale"), py::arg("softcap"),
      py::arg("window_left"), py::arg("window_right"), py::arg("dropout_p"),
      py::arg("dropout_seed"), py::arg("enable_gqa"),
      "The path sdpa_forward and sdpa_backward take for this call: \"fp32 kernel\", or "
      "attn::kernels::sdpa_bf16_path's \"AMX\", \"AVX512-BF16\" or \"bf16 tiles widened to "
      "fp32\".");

  m.def(
      "sdpa_backward",
      [](const Ref& dout, const Ref& q, const Ref& k, const Ref& v, const Ref& out,
         const Ref& lse, const Ref& dq, const Ref& dk, const Ref& dv,
         const std::optional<Ref>& mask, const std::optional<Ref>& alibi, bool is_causal,
         bool bottom_right, std::optional<float> scale, float softcap, int64_t window_left,
         int64_t window_right, float dropout_p, uint64_t dropout_seed, bool enable_gqa,
         int threads) {
        const attn::StridedTensor gs = strided("grad_out", dout), qs = strided("query", q),
                                  ks = strided("key", k), vs = strided("value", v),
                                  os = strided("out", out), ls = strided("lse", lse),
                                  dqs = strided("dq", dq), dks = strided("dk", dk),
                                  dvs = strided("dv", dv);
        const auto ms = optional_strided("attn_mask", mask);
        const auto as = optional_strided("alibi_slopes", alibi);
        const attn::SdpaOptions opt =
            options_of(is_causal, bottom_right, scale, softcap, window_left, window_right,
                       dropout_p, dropout_seed, enable_gqa);
        run(threads, [&] {
          attn::sdpa_backward_strided(kWho, gs, qs, ks, vs, os, ls, dqs, dks, dvs, ptr(ms),
                                      ptr(as), opt);
        });
      },
      py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
      py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("mask"), py::arg("alibi"),
      py::arg("is_causal"), py::arg("bottom_right"), py::arg("scale"), py::arg("softcap"),
      py::arg("window_left"), py::arg("window_right"), py::arg("dropout_p"),
      py::arg("dropout_seed"), py::arg("enable_gqa"), py::arg("threads"),
      "Writes dq, dk, dv in place: attn's fused sdpa backward (out and lse from the forward).");

  m.def(
      "sdpa_varlen_forward",
      [](const Ref& q, const Ref& k, const Ref& v, const Ref& out, const Ref& lse,
         const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_q,
         int64_t max_k, const std::optional<Ref>& alibi, bool is_causal, bool bottom_right,
         std::optional<float> scale, float softcap, int64_t window_left, int64_t window_right,
         float dropout_p, uint64_t dropout_seed, bool enable_gqa, int threads) {
        const attn::StridedTensor qs = strided("q", q), ks = strided("k", k),
                                  vs = strided("v", v), os = strided("out", out),
                                  ls = strided("lse", lse);
        const auto as = optional_strided("alibi_slopes", alibi);
        const attn::SdpaOptions opt =
            options_of(is_causal, bottom_right, scale, softcap, window_left, window_right,
                       dropout_p, dropout_seed, enable_gqa);
        run(threads, [&] {
          attn::sdpa_varlen_forward_strided(kWho, qs, ks, vs, os, ls, cu_q, cu_k, max_q, max_k,
                                            ptr(as), opt);
        });
      },
      py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
      py::arg("cu_seqlens_q"), py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"),
      py::arg("max_seqlen_k"), py::arg("alibi"), py::arg("is_causal"), py::arg("bottom_right"),
      py::arg("scale"), py::arg("softcap"), py::arg("window_left"), py::arg("window_right"),
      py::arg("dropout_p"), py::arg("dropout_seed"), py::arg("enable_gqa"), py::arg("threads"),
      "Packed variable-length batch: writes out (total_q, Hq, Dv) and lse (Hq, total_q).");

  m.def(
      "sdpa_varlen_backward",
      [](const Ref& dout, const Ref& q, const Ref& k, const Ref& v, const Ref& out,
         const Ref& lse, const Ref& dq, const Ref& dk, const Ref& dv,
         const std::vector<int64_t>& cu_q, const std::vector<int64_t>& cu_k, int64_t max_q,
         int64_t max_k, const std::optional<Ref>& alibi, bool is_causal, bool bottom_right,
         std::optional<float> scale, float softcap, int64_t window_left, int64_t window_right,
         float dropout_p, uint64_t dropout_seed, bool enable_gqa, int threads) {
        const attn::StridedTensor gs = strided("grad_out", dout), qs = strided("q", q),
                                  ks = strided("k", k), vs = strided("v", v),
                                  os = strided("out", out), ls = strided("lse", lse),
                                  dqs = strided("dq", dq), dks = strided("dk", dk),
                                  dvs = strided("dv", dv);
        const auto as = optional_strided("alibi_slopes", alibi);
        const attn::SdpaOptions opt =
            options_of(is_causal, bottom_right, scale, softcap, window_left, window_right,
                       dropout_p, dropout_seed, enable_gqa);
        run(threads, [&] {
          attn::sdpa_varlen_backward_strided(kWho, gs, qs, ks, vs, os, ls, dqs, dks, dvs, cu_q,
                                             cu_k, max_q, max_k, ptr(as), opt);
        });
      },
      py::arg("dout"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"),
      py::arg("dq"), py::arg("dk"), py::arg("dv"), py::arg("cu_seqlens_q"),
      py::arg("cu_seqlens_k"), py::arg("max_seqlen_q"), py::arg("max_seqlen_k"),
      py::arg("alibi"), py::arg("is_causal"), py::arg("bottom_right"), py::arg("scale"),
      py::arg("softcap"), py::arg("window_left"), py::arg("window_right"), py::arg("dropout_p"),
      py::arg("dropout_seed"), py::arg("enable_gqa"), py::arg("threads"),
      "Packed variable-length batch: writes dq, dk, dv in place.");

  m.def(
      "dropout_noise",
      [](const Ref& noise, float dropout_p, uint64_t dropout_seed) {
        attn::sdpa_dropout_noise_strided(kWho, strided("noise", noise), dropout_p, dropout_seed);
      },
      py::arg("noise"), py::arg("dropout_p"), py::arg("dropout_seed"),
      "Writes the dropout factors Z (0 or 1/(1-p)) the kernels apply for (b, h, i, j).");

  // GPT-2's tokenizer (attn/tokenizer.h); python/attn/_tokenizer.py gives it tiktoken's API.
  using attn::text::Tokenizer;
  py::class_<Tokenizer>(m, "Tokenizer")
      .def_static("gpt2", &Tokenizer::gpt2, py::return_value_policy::reference,
                  "GPT-2's vocabulary, embedded in the library.")
      .def_static("from_files", &Tokenizer::from_files, py::arg("vocab_json"),
                  py::arg("merges_txt"), "A vocabulary in Hugging Face's vocab.json + merges.txt.")
      .def(
          "encode",
          [](const Tokenizer& t, const std::string& text, bool allow_special, int threads) {
            py::gil_scoped_release release;
            return threads == 1 ? t.encode(text, allow_special)
                                : t.encode_parallel(text, allow_special, threads);
          },
          py::arg("text"), py::arg("allow_special"), py::arg("threads"),
          "The ids of UTF-8 text (threads 1: one thread; else encode_parallel's).")
      .def(
          "encode_batch",
          [](const Tokenizer& t, const std::vector<std::string>& texts,
             const std::vector<bool>& allow_special, int threads) {
            if (allow_special.size() != texts.size())
              throw std::invalid_argument(
                  "Tokenizer.encode_batch: " + std::to_string(allow_special.size()) +
                  " flags for " + std::to_string(texts.size()) + " texts");
            if (threads < 1)
              throw std::invalid_argument("Tokenizer.encode_batch: threads must be >= 1, got " +
                                          std::to_string(threads));
            std::vector<std::vector<int64_t>> ids(texts.size());
            std::exception_ptr failure;
            py::gil_scoped_release release;
    // The texts shared out one at a time (dynamic: their lengths differ);
    // each encoded on its thread, into its own slot.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
            for (int64_t n = 0; n < int64_t(texts.size()); ++n) {
              try {
                ids[size_t(n)] = t.encode(texts[size_t(n)], allow_special[size_t(n)]);
              } catch (...) {
#pragma omp critical(attn_encode_batch)
                if (!failure) failure = std::current_exception();
              }
            }
            if (failure) std::rethrow_exception(failure);
            return ids;
          },
          py::arg("texts"), py::arg("allow_special"), py::arg("threads"),
          "The ids of each UTF-8 text, the texts encoded on `threads` threads at once.")
      .def(
          "decode_bytes",
          [](const Tokenizer& t, const std::vector<int64_t>& ids) {
            std::string bytes;
            {
              py::gil_scoped_release release;
              bytes = t.decode(ids);
            }
            return py::bytes(bytes);
          },
          py::arg("ids"), "The bytes of the tokens, joined.")
      .def(
          "token_bytes",
          [](const Tokenizer& t, int64_t id) { return py::bytes(t.token_bytes(id)); },
          py::arg("id"))
      .def_property_readonly("vocab_size", &Tokenizer::vocab_size)
      .def_property_readonly("eot_token", &Tokenizer::eot_token);

  // tokenizer.json tokenizers (attn/hf_tokenizer.h): Llama 3, Qwen, Gemma.
  using attn::text::HfTokenizer;
  py::class_<HfTokenizer>(m, "HfTokenizer")
      .def_static("from_file", &HfTokenizer::from_file, py::arg("path"),
                  "A Hugging Face tokenizer.json.")
      .def(
          "encode",
          [](const HfTokenizer& t, const std::string& text, bool add_special_tokens) {
            py::gil_scoped_release release;
            return t.encode(text, add_special_tokens);
          },
          py::arg("text"), py::arg("add_special_tokens"), "The ids of UTF-8 text.")
      .def(
          "decode",
          [](const HfTokenizer& t, const std::vector<int64_t>& ids, bool skip_special_tokens) {
            py::gil_scoped_release release;
            return t.decode(ids, skip_special_tokens);
          },
          py::arg("ids"), py::arg("skip_special_tokens"), "The text of ids.")
      .def("token_to_id", &HfTokenizer::token_to_id, py::arg("token"))
      .def("id_to_token", &HfTokenizer::id_to_token, py::arg("id"))
      .def("is_special", &HfTokenizer::is_special, py::arg("id"))
      .def("describe", &HfTokenizer::describe)
      .def_property_readonly("vocab_size", &HfTokenizer::vocab_size);

  // Chat templates (attn/chat_template.h); python/attn/_models.py passes the
  // messages and the template kwargs as JSON text.
  using attn::text::ChatTemplate;
  py::class_<ChatTemplate>(m, "ChatTemplate")
      .def(py::init<std::string, std::map<std::string, std::string>, std::string>(),
           py::arg("source"), py::arg("special_tokens"), py::arg("name"))
      .def_static("from_model_dir", &ChatTemplate::from_model_dir, py::arg("dir"),
                  "The template of a model directory, or None.")
      .def_static("from_file", &ChatTemplate::from_file, py::arg("path"), py::arg("model_dir"))
      .def(
          "apply_json",
          [](const ChatTemplate& t, const std::string& messages_json, bool add_generation_prompt,
             const std::string& kwargs_json, const std::string& continue_final_message) {
            return t.apply_json(messages_json,
                                {.add_generation_prompt = add_generation_prompt,
                                 .kwargs_json = kwargs_json,
                                 .continue_final_message = continue_final_message});
          },
          py::arg("messages_json"), py::arg("add_generation_prompt"), py::arg("kwargs_json"),
          py::arg("continue_final_message") = "")
      .def_property_readonly("special_tokens", &ChatTemplate::special_tokens)
      .def_property_readonly("source", &ChatTemplate::source);

  // Llama 3 / Qwen / Gemma directories (attn/hf_decoder.h): their logits and
  // generation; python/attn/_models.py gives them torch tensors.
  struct Decoder {
    std::unique_ptr<attn::nn::DecoderLM> model;
    attn::io::HfDecoderInfo info;
  };
  py::class_<Decoder>(m, "DecoderLM")
      .def(py::init([](const std::string& dir, const std::string& dtype, bool mmap) {
             if (dtype != "float32" && dtype != "bfloat16") {
               throw std::invalid_argument(
                   "DecoderLM: dtype must be 'float32' or 'bfloat16', got '" + dtype + "'");
             }
             Decoder d;
             py::gil_scoped_release release;
             d.info = attn::io::load_hf_decoder(
                 dir, d.model, dtype == "bfloat16" ? attn::DType::kBFloat16 : attn::DType::kFloat32,
                 mmap);
             return d;
           }),
           py::arg("dir"), py::arg("dtype"), py::arg("mmap"))
      .def(
          "logits",
          [](Decoder& d, const std::vector<int64_t>& ids, int64_t batch) {
            const auto T = static_cast<int64_t>(ids.size()) / std::max<int64_t>(batch, 1);
            std::string bytes;
            attn::Shape shape;
            {
              py::gil_scoped_release release;
              const attn::Tensor logits =
                  d.model->forward(attn::Tensor::from_int64({batch, T}, ids)).contiguous();
              shape = logits.shape();
              bytes.assign(reinterpret_cast<const char*>(logits.data()),
                           static_cast<size_t>(logits.numel()) * sizeof(float));
            }
            return py::make_tuple(py::bytes(bytes), shape);
          },
          py::arg("ids"), py::arg("batch"),
          "The logits (B, T, V) of ids (B·T, row-major) as float32 bytes and the shape.")
      .def(
          "generate",
          [](Decoder& d, const std::vector<int64_t>& ids, int64_t max_new_tokens, float temperature,
             int64_t top_k, float top_p, uint64_t seed) {
            py::gil_scoped_release release;
            attn::Generator gen(seed);
            attn::nn::GenerateOptions o{.max_new_tokens = max_new_tokens,
                                        .temperature = temperature,
                                        .top_k = top_k,
                                        .top_p = top_p};
            return attn::nn::generate(
                       *d.model,
                       attn::Tensor::from_int64({1, static_cast<int64_t>(ids.size())}, ids), o, gen,
                       d.info.hf.eos_token_ids)
                .to_int64_vector();
          },
          py::arg("ids"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"),
          py::arg("top_p"), py::arg("seed"),
          "The prompt's ids and the new ones, stopping at the model's end ids.")
      .def_property_readonly("model_type", [](const Decoder& d) { return d.info.hf.model_type; })
      .def_property_readonly("vocab_size",
                             [](const Decoder& d) { return d.info.hf.config.vocab_size; })
      .def_property_readonly("eos_token_ids",
                             [](const Decoder& d) { return d.info.hf.eos_token_ids; })
      .def_property_readonly("num_layers",
                             [](const Decoder& d) { return d.info.hf.config.num_layers; });

  m.def(
      "version", [] { return std::string(attn::version()); },
      "attn's version (the file VERSION, through CMake: attn::version()).");
  m.def("kernel_target", [] { return std::string(attn::kernels::sdpa_target()); },
        "The SIMD target attn's sdpa kernel runs (\"AVX3\", \"AVX2\", ...).");
  m.def("bf16_paths", &attn::kernels::flash_attention_bf16_paths,
        "The bf16 paths of the core's kernel this CPU can run, best first (\"AMX\", ...).");
  m.def(
      "use_bf16_path",
      [](const std::optional<std::string>& name) {
        return attn::kernels::flash_attention_bf16_use_path(name ? name->c_str() : nullptr);
      },
      py::arg("name"),
      "Forces the core's bf16 path (a name of bf16_paths(); None: the automatic choice); "
      "false for an unknown name. For tests and benchmarks, not while kernels run.");
  m.def("max_threads", [] { return omp_get_max_threads(); },
        "OpenMP's default thread count in this process (omp_get_max_threads).");
}
