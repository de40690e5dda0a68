// The rate of MPI's allreduce, as data-parallel training uses it to sum
// gradients: MPI_Allreduce and MPI_Iallreduce (started, then waited for) of
// float32 sums, in place, for sizes from 4 KiB to 512 MiB (powers of two).
//
//   mpirun -np 2 --oversubscribe [--allow-run-as-root] build/bench/bench_allreduce
//       [--min-bytes 4096] [--max-bytes 536870912] [--repeats R] [--json FILE]
//
// Each size: one warm-up call, then R timed calls (default: 20 up to 1 MiB, 10
// up to 64 MiB, 5 above), each between barriers; a call's time is the slowest
// rank's. Reported per size and operation: the median and the minimum time,
// the algorithm bandwidth bytes / t and the bus bandwidth
//   busbw = 2 (N - 1) / N x bytes / t,
// the bytes each rank sends and receives in a ring allreduce over N ranks
// (NCCL's convention), so that busbw is comparable across N and with a link's
// rate. bench/project_scaling.py reads the JSON (--allreduce-json).
// MPI's C API only (OpenMPI's and MPICH's C++ bindings trip -Wcast-function-type).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Options {
  int64_t min_bytes = 4096;
  int64_t max_bytes = int64_t{512} << 20;
  int repeats = 0;  // 0: by size
  std::string json;
};

int64_t parse_int(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 1)
    throw std::invalid_argument(fmt::format("{} must be a positive integer", name));
  return v;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", a));
      return argv[++i];
    };
    if (a == "--min-bytes") o.min_bytes = parse_int("--min-bytes", value());
    else if (a == "--max-bytes") o.max_bytes = parse_int("--max-bytes", value());
    else if (a == "--repeats") o.repeats = static_cast<int>(std::min<int64_t>(parse_int("--repeats", value()), 100000));
    else if (a == "--json") o.json = value();
    else if (a == "--help" || a == "-h") throw std::invalid_argument("help");
    else throw std::invalid_argument("unknown argument (see --help)");
  }
  if (o.min_bytes < 4 || o.min_bytes > o.max_bytes)
    throw std::invalid_argument(fmt::format("need 4 <= --min-bytes {} <= --max-bytes {}", o.min_bytes, o.max_bytes));
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Result {
  const char* op;
  int64_t bytes;
  int repeats;
  double median_s, min_s;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const std::invalid_argument& e) {
    const bool help = std::string(e.what()) == "help";
    if (rank == 0) {
      if (help)
        std::printf(
            "usage: mpirun -np N bench_allreduce [--min-bytes B] [--max-bytes B] [--repeats R] [--json FILE]\n"
            "MPI_Allreduce and MPI_Iallreduce (float32 sum, in place) bus bandwidth, sizes min..max in powers of 2\n");
      else
        std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    }
    MPI_Finalize();
    return help ? 0 : 2;
  }

  // Zeros: the sums stay finite however many calls add them up (a float sum
  // takes the same time for any finite value on x86-64: no denormals here).
  std::vector<float> buf(static_cast<size_t>(o.max_bytes / 4), 0.0f);
  std::vector<Result> results;
  const double ring = 2.0 * (ranks - 1) / ranks;
  if (rank == 0)
    std::printf("%d ranks; busbw = 2(N-1)/N x bytes / t\n%12s %12s %12s %12s %12s %12s\n", ranks, "bytes",
                "op", "median_us", "min_us", "algbw_GB/s", "busbw_GB/s");
  for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
    const int count = static_cast<int>(bytes / 4);
    const int repeats = o.repeats > 0 ? o.repeats : bytes <= (1 << 20) ? 20 : bytes <= (64 << 20) ? 10 : 5;
    for (const char* op : {"allreduce", "iallreduce"}) {
      const bool nonblocking = op[0] == 'i';
      std::vector<double> times;
      for (int r = -1; r < repeats; ++r) {  // r = -1: the warm-up
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        if (nonblocking) {
          MPI_Request request;
          MPI_Iallreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
          MPI_Wait(&request, MPI_STATUS_IGNORE);
        } else {
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        }
        double t = MPI_Wtime() - t0, slowest = 0.0;
        MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r >= 0) times.push_back(slowest);
      }
      const Result res{op, bytes, repeats, median(times), *std::min_element(times.begin(), times.end())};
      results.push_back(res);
      if (rank == 0)
        std::printf("%12lld %12s %12.1f %12.1f %12.3f %12.3f\n", static_cast<long long>(bytes), op,
                    res.median_s * 1e6, res.min_s * 1e6, static_cast<double>(bytes) / res.median_s * 1e-9,
                    ring * static_cast<double>(bytes) / res.median_s * 1e-9);
      std::fflush(stdout);
    }
  }

  if (rank == 0 && !o.json.empty()) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string lib(version, static_cast<size_t>(len));
    lib = lib.substr(0, lib.find_first_of("\r\n"));
    for (char& c : lib)
      if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
    std::string j = fmt::format("{{\"ranks\": {}, \"mpi_library\": \"{}\", \"busbw_factor\": {}, \"results\": [\n",
                                ranks, lib, ring);
    for (size_t k = 0; k < results.size(); ++k) {
      const Result& r = results[k];
      const double b = static_cast<double>(r.bytes);
      j += fmt::format(
          "  {{\"op\": \"{}\", \"bytes\": {}, \"repeats\": {}, \"median_s\": {:.9g}, \"min_s\": {:.9g}, "
          "\"algbw_GBps\": {:.6g}, \"busbw_GBps\": {:.6g}}}{}\n",
          r.op, r.bytes, r.repeats, r.median_s, r.min_s, b / r.median_s * 1e-9, ring * b / r.median_s * 1e-9,
          k + 1 < results.size() ? "," : "");
    }
    j += "]}\n";
    // Beside the target, then renamed: a reader never sees half a file.
    const std::string tmp = o.json + ".tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    bool ok = f != nullptr && std::fwrite(j.data(), 1, j.size(), f) == j.size();
    if (f != nullptr) ok = std::fclose(f) == 0 && ok;
    if (!ok || std::rename(tmp.c_str(), o.json.c_str()) != 0) {
      std::fprintf(stderr, "bench_allreduce: cannot write the JSON file\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return 0;
}
