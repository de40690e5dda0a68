// train_flags.h - the range of each integer flag of `attn train` (issue 46,
// numbers at the edges).
//
// One table: TrainOptions::validate() (attn/train.h) checks a run's values
// against it (a resumed run's train_args among them), and the CLI checks
// each flag's text against it as it is parsed, so a value past int64 is
// refused by the text the user typed, not as int64's largest value. The
// upper bounds are far above any model attn trains, so that no size, or a
// product of sizes, overflows or asks for memory no machine has; what the
// sizes imply together (tokens per micro-batch, the blocks' parameters) is
// validate()'s.
#pragma once

#include <cstdint>
#include <vector>

#include "attn/train.h"

namespace attn::train {

struct FlagRange {
  const char* flag;  // the flag without its dashes: "epochs"
  int64_t min, max;
  int64_t TrainOptions::*field;  // &TrainOptions::epochs
};

// Every int64_t flag of TrainOptions with its range (--seed, a uint64_t,
// takes 0..2^64 - 1).
const std::vector<FlagRange>& integer_flag_ranges();

}  // namespace attn::train
