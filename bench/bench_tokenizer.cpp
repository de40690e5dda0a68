// GPT-2's tokenizer (attn/tokenizer.h): Tokenizer::encode on one thread and
// encode_parallel on all of them, on data/tinyshakespeare.txt,
// data/the-verdict.txt and any text given with --text NAME=PATH.
//   ./build/bench/bench_tokenizer --text multilingual=FILE --benchmark_repetitions=5
//       --benchmark_report_aggregates_only   (one command line)
// bench/compare_tiktoken.py runs it beside tiktoken (and makes the multilingual
// text). Reported: bytes_per_second (MB/s of UTF-8 input) and tokens/s.
// Each benchmark first checks encode_parallel's ids against encode's and
// decode(encode(text)) against the text, and refuses to time a wrong result.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "attn/tokenizer.h"

#ifndef ATTN_DATA_DIR
#define ATTN_DATA_DIR "data"
#endif

namespace {

using attn::text::Tokenizer;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "bench_tokenizer: cannot read " << path << "\n";
    std::exit(1);
  }
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void encode(benchmark::State& state, const std::string* text, bool parallel) {
  const Tokenizer& tok = Tokenizer::gpt2();
  const std::vector<int64_t> expected = tok.encode(*text);
  if (tok.decode(expected) != *text || tok.encode_parallel(*text) != expected) {
    state.SkipWithError(
        "encode_parallel differs from encode, or decode(encode(text)) from the text");
    return;
  }
  for (auto _ : state) {
    std::vector<int64_t> ids = parallel ? tok.encode_parallel(*text) : tok.encode(*text);
    benchmark::DoNotOptimize(ids.data());
  }
  const auto n = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(text->size()));
  state.counters["tokens/s"] =
      benchmark::Counter(n * static_cast<double>(expected.size()), benchmark::Counter::kIsRate);
  state.counters["tokens"] = static_cast<double>(expected.size());
  state.counters["threads"] = parallel ? omp_get_max_threads() : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Our own --text NAME=PATH options, then Google Benchmark's.
  std::vector<std::pair<std::string, std::string>> files = {
      {"tinyshakespeare", std::string(ATTN_DATA_DIR) + "/tinyshakespeare.txt"},
      {"the-verdict", std::string(ATTN_DATA_DIR) + "/the-verdict.txt"}};
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    std::string value;
    if (a == "--text" && i + 1 < argc) {
      value = argv[++i];
    } else if (a.rfind("--text=", 0) == 0) {
      value = a.substr(7);
    } else {
      rest.push_back(argv[i]);
      continue;
    }
    const size_t eq = value.find('=');
    if (eq == std::string::npos) {
      std::cerr << "bench_tokenizer: --text wants NAME=PATH, got " << value << "\n";
      return 2;
    }
    files.emplace_back(value.substr(0, eq), value.substr(eq + 1));
  }
  static std::vector<std::string> texts;  // outlive the registered benchmarks
  texts.reserve(files.size());
  for (const auto& [name, path] : files) texts.push_back(read_file(path));
  Tokenizer::gpt2();  // build the vocabulary before any timing
  for (size_t k = 0; k < files.size(); ++k) {
    // Wall-clock time for both (tiktoken is timed by the wall clock too).
    benchmark::RegisterBenchmark(("encode/" + files[k].first).c_str(), encode, &texts[k], false)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("encode_parallel/" + files[k].first).c_str(), encode, &texts[k],
                                 true)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  int n = static_cast<int>(rest.size());
  benchmark::Initialize(&n, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
