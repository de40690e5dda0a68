// A program that uses attn/dist.h, the data-parallel training library
// (attn::dist, attn-dist.pc), the way another project would. Its calls live in
// the same object as the MPI ones, so linking it needs MPI's library when attn
// was built with MPI: a package that left it out fails here. Run outside mpirun:
// not launched, and available() as the exported ATTN_WITH_MPI says. Built
// without MPI, MpiCollective::init must refuse with a message saying so.
#include <attn/dist.h>

#include <cstdio>
#include <stdexcept>
#include <string>

int main() {
  using namespace attn;
  if (dist::launched()) {
    std::fprintf(stderr, "attn dist consumer: FAILED, launched() outside mpirun\n");
    return 1;
  }
#ifdef ATTN_WITH_MPI
  const bool expected = true;
#else
  const bool expected = false;
#endif
  if (dist::available() != expected) {
    std::fprintf(stderr, "attn dist consumer: FAILED, available() is %d, ATTN_WITH_MPI says %d\n",
                 static_cast<int>(dist::available()), static_cast<int>(expected));
    return 1;
  }
  if (!dist::available()) {
    try {
      (void)dist::MpiCollective::init(false);
      std::fprintf(stderr, "attn dist consumer: FAILED, init without MPI did not throw\n");
      return 1;
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find("MPI") == std::string::npos) {
        std::fprintf(stderr, "attn dist consumer: FAILED, init's message names no MPI: %s\n",
                     e.what());
        return 1;
      }
    }
  }
  std::printf("attn dist consumer: MPI %s\n", dist::available() ? "built in" : "not built in");
  std::printf("attn dist consumer: OK\n");
  return 0;
}
