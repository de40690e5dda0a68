// attn/dist.h - data-parallel training over MPI (`mpirun -np N attn train`).
//
//   available()       whether this attn was built with MPI (ATTN_WITH_MPI)
//   launched()        whether the process was started by an MPI launcher
//                     (mpirun / mpiexec: OMPI_COMM_WORLD_SIZE, PMI_SIZE or
//                     PMIX_RANK in the environment)
//   MpiCollective     train::Collective over MPI_COMM_WORLD: the gradient
//                     buckets summed with non-blocking MPI_Iallreduce started
//                     as backward finishes each bucket (progressed with
//                     MPI_Testall at every later bucket), waited on before the
//                     optimizer; with `deterministic` and more than 2 ranks an
//                     MPI_Iallgather of the buckets summed in rank order
//                     instead (bit-identical to one rank accumulating the same
//                     micro-batches; for 2 ranks the sum is a + b either way).
//                     MPI errors return (MPI_ERRORS_RETURN) and are thrown as
//                     std::runtime_error naming the call.
//
// Built without MPI, MpiCollective::init throws std::runtime_error saying so.
// See docs/distributed.md.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "attn/train.h"

namespace attn::dist {

bool available();

// Thrown by check_agreement, on every rank alike (so they can end together).
class DisagreementError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
bool launched();

class MpiCollective : public train::Collective {
 public:
  // MPI_Init (once per process); MPI_Finalize in the destructor.
  static std::unique_ptr<MpiCollective> init(bool deterministic);
  ~MpiCollective() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Ranks on this host (MPI_Comm_split_type MPI_COMM_TYPE_SHARED).
  int local_size() const { return local_size_; }
  void set_buckets(const std::vector<std::vector<nn::Parameter*>>& buckets) override;
  void start_bucket(size_t b) override;
  void finish_buckets() override;
  std::vector<double> allgather(const std::vector<double>& values) override;
  void broadcast(float* data, int64_t n, int root) override;

  // Ends every rank of the job (MPI_Abort) with this exit code.
  [[noreturn]] void abort(int code);
  // Whether any rank says true (MPI_Allreduce, MPI_LOR).
  bool any(bool mine);
  // Start-up agreement: every rank's (field, value) pairs, in the same order
  // on every rank; a value is hashed (FNV-1a, 64 bits) and the hashes
  // allgathered. Throws DisagreementError on every rank naming the first
  // rank whose value differs from rank 0's and the field, before any step.
  void check_agreement(const std::vector<std::pair<std::string, std::string>>& fields);

  // Seconds blocked in finish_buckets' wait, and the bytes of gradients each
  // step sends into the reduction, since the last take_wait_seconds().
  double take_wait_seconds();
  int64_t bucket_bytes() const { return bucket_bytes_; }
  bool deterministic() const { return deterministic_; }

  // Fault injection for the tests: ATTN_TEST_KILL_RANK=r and
  // ATTN_TEST_KILL_STEP=s make rank r SIGKILL itself during step s's
  // backward (after its first bucket has been started).
  void set_step(int64_t step) { step_ = step; }

  struct Impl;

 private:
  MpiCollective() = default;
  int rank_ = 0, size_ = 1, local_size_ = 1;
  bool deterministic_ = false;
  double wait_s_ = 0.0;
  int64_t bucket_bytes_ = 0;
  int64_t step_ = -1;
  int64_t kill_rank_ = -1, kill_step_ = -1;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attn::dist
