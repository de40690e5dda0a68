// attn::read_file and attn::read_stream (attn/read_file.h): every kind of
// path that is not a regular file refused by name before it is opened, the
// size limit of a file and of a stream, and paths escaped in the messages.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>

#include "attn/read_file.h"
#include "cli.h"

namespace {

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(ReadFile, ReadsARegularFileAndRefusesEveryOtherKindByName) {
  const std::string dir = attn::test::temp_path("read_file");
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/ten.txt";
  std::ofstream(file, std::ios::binary) << std::string("0123456789");
  EXPECT_EQ(attn::read_file(file), "0123456789");
  EXPECT_EQ(attn::read_file(file, 10), "0123456789");
  EXPECT_EQ(message_of([&] { attn::read_file(file, 9); }),
            "'" + file + "' has 10 bytes, more than the limit of 9");

  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const struct {
    std::string path, message;
  } cases[] = {
      {dir + "/missing", "'" + dir + "/missing': no such file"},
      {dir, "'" + dir + "' is a directory, not a regular file"},
      {fifo, "'" + fifo + "' is a FIFO (named pipe), not a regular file"},  // no wait for a writer
      {"/dev/zero", "'/dev/zero' is a character device, not a regular file"},
      {"/dev/null", "'/dev/null' is a character device, not a regular file"},
      {dir + "/\x1b[2J\xff", "'" + dir + "/\\x1B[2J\\xFF': no such file"},
  };
  for (const auto& c : cases) EXPECT_EQ(message_of([&] { attn::read_file(c.path); }), c.message);
  std::filesystem::remove_all(dir);
}

TEST(ReadFile, AStreamIsReadToItsEndWithinTheLimit) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::thread writer([&] {
    const std::string bytes(100000, 'x');  // more than one pipe buffer
    for (size_t at = 0; at < bytes.size();) {
      const ssize_t n = ::write(fds[1], bytes.data() + at, bytes.size() - at);
      if (n <= 0) break;
      at += static_cast<size_t>(n);
    }
    ::close(fds[1]);
  });
  EXPECT_EQ(attn::read_stream(fds[0], "standard input").size(), 100000u);
  writer.join();
  ::close(fds[0]);

  // An endless stream stops at the limit.
  const int zero = ::open("/dev/zero", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(zero, 0);
  EXPECT_EQ(message_of([&] { attn::read_stream(zero, "standard input", 1 << 20); }),
            "standard input holds more than the limit of 1048576 bytes");
  ::close(zero);
}

}  // namespace
