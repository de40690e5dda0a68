// attn/float_decimal.h - a float written as the shortest decimal that reads
// back as the same float (1e-06, not the 9.99999997e-07 its widening to
// double prints), for the JSON files and listings attn writes.
#pragma once

namespace attn {

// The double whose shortest decimal form is f's (fmt's shortest round trip of
// the float, parsed as a double); infinities and NaN pass through as they are.
double shortest_decimal(float f);

}  // namespace attn
