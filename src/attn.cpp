// The library as a whole (attn/attn.h): its version, the one string the CLI's
// --version and the installed package report (CMake's project version,
// compiled in here and nowhere else in C++).
#include "attn/attn.h"

#ifndef ATTN_VERSION
#error "ATTN_VERSION is set by CMakeLists.txt (the project's version)"
#endif

namespace attn {

const char* version() { return ATTN_VERSION; }

}  // namespace attn
