// Data-parallel training over MPI (attn/dist.h).
#include "attn/dist.h"
#include "attn/fnv1a.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#ifdef ATTN_WITH_MPI
#include <mpi.h>
#endif

namespace attn::dist {

bool available() {
#ifdef ATTN_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool launched() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

#ifndef ATTN_WITH_MPI

struct MpiCollective::Impl {};

std::unique_ptr<MpiCollective> MpiCollective::init(bool) {
  throw std::runtime_error(
      "this attn was built without MPI: install OpenMPI (apt-get install openmpi-bin "
      "libopenmpi-dev, or ./scripts/bootstrap --tests) and configure and build again");
}
MpiCollective::~MpiCollective() = default;
void MpiCollective::set_buckets(const std::vector<std::vector<nn::Parameter*>>&) {}
void MpiCollective::start_bucket(size_t) {}
void MpiCollective::finish_buckets() {}
std::vector<double> MpiCollective::allgather(const std::vector<double>& v) { return v; }
void MpiCollective::broadcast(float*, int64_t, int) {}
bool MpiCollective::any(bool mine) { return mine; }
void MpiCollective::abort(int code) { std::exit(code); }
void MpiCollective::check_agreement(const std::vector<std::pair<std::string, std::string>>&) {}
double MpiCollective::take_wait_seconds() { return 0.0; }

#else

namespace {

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw std::runtime_error(fmt::format("MPI: {} failed: {}", call, std::string(text, static_cast<size_t>(len))));
}

}  // namespace

struct MpiCollective::Impl {
  struct Bucket {
    std::vector<nn::Parameter*> params;
    std::vector<float> send;      // the bucket's gradients, packed; the sum after an allreduce
    std::vector<float> gathered;  // deterministic: every rank's send, rank after rank
    MPI_Request request = MPI_REQUEST_NULL;
    bool started = false;
  };
  std::vector<Bucket> buckets;
};

std::unique_ptr<MpiCollective> MpiCollective::init(bool deterministic) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  std::unique_ptr<MpiCollective> c(new MpiCollective());
  c->impl_ = std::make_unique<Impl>();
  c->deterministic_ = deterministic;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &c->size_), "MPI_Comm_size");
  MPI_Comm local;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, c->rank_, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type");
  check(MPI_Comm_size(local, &c->local_size_), "MPI_Comm_size");
  MPI_Comm_free(&local);
  if (const char* r = std::getenv("ATTN_TEST_KILL_RANK")) c->kill_rank_ = std::atoll(r);
  if (const char* s = std::getenv("ATTN_TEST_KILL_STEP")) c->kill_step_ = std::atoll(s);
  return c;
}

MpiCollective::~MpiCollective() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void MpiCollective::set_buckets(const std::vector<std::vector<nn::Parameter*>>& buckets) {
  impl_->buckets.clear();
  bucket_bytes_ = 0;
  for (const auto& params : buckets) {
    Impl::Bucket b;
    b.params = params;
    size_t n = 0;
    for (const nn::Parameter* p : params) n += static_cast<size_t>(p->grad.numel());
    b.send.resize(n);
    if (deterministic_ && size_ > 2) b.gathered.resize(n * static_cast<size_t>(size_));
    bucket_bytes_ += static_cast<int64_t>(n * sizeof(float));
    impl_->buckets.push_back(std::move(b));
  }
}

void MpiCollective::start_bucket(size_t index) {
  Impl::Bucket& b = impl_->buckets.at(index);
  size_t at = 0;
  for (const nn::Parameter* p : b.params) {
    const auto n = static_cast<size_t>(p->grad.numel());
    std::memcpy(b.send.data() + at, p->grad.data(), n * sizeof(float));
    at += n;
  }
  const int count = static_cast<int>(b.send.size());
  if (b.gathered.empty()) {
    check(MPI_Iallreduce(MPI_IN_PLACE, b.send.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &b.request),
          "MPI_Iallreduce");
  } else {
    check(MPI_Iallgather(b.send.data(), count, MPI_FLOAT, b.gathered.data(), count, MPI_FLOAT, MPI_COMM_WORLD,
                         &b.request),
          "MPI_Iallgather");
  }
  b.started = true;
  // Open MPI progresses non-blocking collectives inside MPI calls: test the
  // earlier buckets so that they move on while backward computes.
  for (size_t i = 0; i < index; ++i) {
    if (impl_->buckets[i].request == MPI_REQUEST_NULL) continue;
    int done = 0;
    check(MPI_Test(&impl_->buckets[i].request, &done, MPI_STATUS_IGNORE), "MPI_Test");
  }
  if (index == 0 && rank_ == kill_rank_ && step_ == kill_step_) std::raise(SIGKILL);
}

void MpiCollective::finish_buckets() {
  std::vector<MPI_Request> requests;
  for (auto& b : impl_->buckets) {
    if (!b.started) throw std::logic_error("MpiCollective: finish_buckets() before every bucket started");
    requests.push_back(b.request);
  }
  const auto t0 = std::chrono::steady_clock::now();
  check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& b : impl_->buckets) {
    b.request = MPI_REQUEST_NULL;
    b.started = false;
    const size_t n = b.send.size();
    if (!b.gathered.empty()) {  // the sum in rank order: ((g0 + g1) + g2) + ...
      std::memcpy(b.send.data(), b.gathered.data(), n * sizeof(float));
      for (int r = 1; r < size_; ++r) {
        const float* src = b.gathered.data() + static_cast<size_t>(r) * n;
        for (size_t j = 0; j < n; ++j) b.send[j] += src[j];
      }
    }
    size_t at = 0;
    for (nn::Parameter* p : b.params) {
      const auto k = static_cast<size_t>(p->grad.numel());
      std::memcpy(p->grad.data(), b.send.data() + at, k * sizeof(float));
      at += k;
    }
  }
}

std::vector<double> MpiCollective::allgather(const std::vector<double>& values) {
  std::vector<double> all(values.size() * static_cast<size_t>(size_));
  check(MPI_Allgather(values.data(), static_cast<int>(values.size()), MPI_DOUBLE, all.data(),
                      static_cast<int>(values.size()), MPI_DOUBLE, MPI_COMM_WORLD),
        "MPI_Allgather");
  return all;
}

void MpiCollective::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void MpiCollective::broadcast(float* data, int64_t n, int root) {
  constexpr int64_t kChunk = int64_t{1} << 30;  // MPI counts are int
  for (int64_t at = 0; at < n; at += kChunk)
    check(MPI_Bcast(data + at, static_cast<int>(std::min(kChunk, n - at)), MPI_FLOAT, root, MPI_COMM_WORLD),
          "MPI_Bcast");
}

bool MpiCollective::any(bool mine) {
  int in = mine ? 1 : 0, out = 0;
  check(MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD), "MPI_Allreduce");
  return out != 0;
}

void MpiCollective::check_agreement(const std::vector<std::pair<std::string, std::string>>& fields) {
  std::vector<uint64_t> mine;
  for (const auto& [name, value] : fields) mine.push_back(fnv1a64(value.data(), value.size()));
  const size_t F = mine.size();
  // The field count first, so that ranks of different builds cannot misread each other.
  uint64_t count = F;
  std::vector<uint64_t> counts(static_cast<size_t>(size_));
  check(MPI_Allgather(&count, 1, MPI_UINT64_T, counts.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), "MPI_Allgather");
  for (int r = 1; r < size_; ++r) {
    if (counts[static_cast<size_t>(r)] != counts[0])
      throw DisagreementError(fmt::format(
          "rank {} disagrees with rank 0 on the binary's version ({} start-up fields against {}): run "
          "the same attn on every rank",
          r, counts[static_cast<size_t>(r)], counts[0]));
  }
  std::vector<uint64_t> all(F * static_cast<size_t>(size_));
  check(MPI_Allgather(mine.data(), static_cast<int>(F), MPI_UINT64_T, all.data(), static_cast<int>(F),
                      MPI_UINT64_T, MPI_COMM_WORLD),
        "MPI_Allgather");
  for (int r = 1; r < size_; ++r) {
    for (size_t f = 0; f < F; ++f) {
      const uint64_t a = all[f], b = all[static_cast<size_t>(r) * F + f];
      if (a != b)
        throw DisagreementError(fmt::format(
            "rank {} disagrees with rank 0 on {} (hash {:016x}, rank 0 {:016x}): every rank must run "
            "the same attn with the same flags on the same data; nothing was trained",
            r, fields[f].first, b, a));
    }
  }
}

double MpiCollective::take_wait_seconds() {
  const double s = wait_s_;
  wait_s_ = 0.0;
  return s;
}

#endif

}  // namespace attn::dist
