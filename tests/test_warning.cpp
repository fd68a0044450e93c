// vitrain's warnings (core/warning.h): one line on stderr, and the same line in the rank log
// once one is set (a data-parallel worker rank's rank<R>.log), whole under concurrent writers.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "core/warning.h"

namespace {

std::string read_all(std::FILE* f) {
  std::fflush(f);
  std::rewind(f);
  std::string s;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) s.append(buf, n);
  return s;
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = 0; (p = s.find(what, p)) != std::string::npos; p += what.size()) ++n;
  return n;
}

TEST(Warning, GoesToStderrAndOnceALogIsSetToItToo) {
  std::FILE* log = std::tmpfile();
  ASSERT_NE(log, nullptr);
  ::testing::internal::CaptureStderr();
  vit::warn("before the log");
  vit::set_warning_log(log);
  vit::warn("skipping unreadable image a.jpg: truncated");
  vit::set_warning_log(nullptr);
  vit::warn("after the log");
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err,
            "warning: before the log\nwarning: skipping unreadable image a.jpg: truncated\n"
            "warning: after the log\n");
  EXPECT_EQ(read_all(log), "warning: skipping unreadable image a.jpg: truncated\n");
  std::fclose(log);
}

TEST(Warning, LinesFromConcurrentThreadsStayWhole) {
  std::FILE* log = std::tmpfile();
  ASSERT_NE(log, nullptr);
  vit::set_warning_log(log);
  ::testing::internal::CaptureStderr();
  const std::string text(300, 'x');
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) vit::warn(text);
    });
  for (auto& t : threads) t.join();
  vit::set_warning_log(nullptr);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string line = "warning: " + text + "\n";
  EXPECT_EQ(count_of(err, line), 200u);
  EXPECT_EQ(count_of(read_all(log), line), 200u);
  std::fclose(log);
}

}  // namespace
