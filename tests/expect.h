// tests/expect.h - asserting that a call throws a given exception with a given message.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <string>

namespace attn::test {

// f() must throw Ex whose what() is exactly message.
template <class Ex>
void expect_message(const std::function<void()>& f, const std::string& message) {
  try {
    f();
    ADD_FAILURE() << "no exception, expected: " << message;
  } catch (const Ex& e) {
    EXPECT_EQ(std::string(e.what()), message);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what() << "; expected: " << message;
  }
}

}  // namespace attn::test
