// Shared pieces of the libFuzzer targets (fuzz/fuzz_*.cpp).
//
// The contract every target checks: a parser given arbitrary bytes either returns or throws
// vit::Error. Only vit::Error is caught; any other exception escapes to libFuzzer (which reports
// it as a crash), as does every sanitizer report, leak, timeout or oversized allocation.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/common.h"

namespace vit::fuzz {

// An in-memory file (memfd) that parsers taking a path can open as /proc/self/fd/N: no disk
// writes per input, and mmap, pread, ifstream and gzopen all work on it. One per target, reused.
class MemFile {
 public:
  explicit MemFile(const char* name) {
    fd_ = ::memfd_create(name, MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the contents with data[0, n).
  void set(const uint8_t* data, size_t n) {
    if (::ftruncate(fd_, 0) != 0) fail("ftruncate");
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pwrite(fd_, data + done, n - done, off_t(done));
      if (got <= 0) fail("pwrite");
      done += size_t(got);
    }
  }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] static void fail(const char* what) {
    std::perror(what);
    std::abort();
  }
  int fd_ = -1;
  std::string path_;
};

// Runs the parser; bad input must surface as vit::Error and nothing else. With
// VIT_FUZZ_VERBOSE=1 in the environment the error is printed (to see why a seed is refused).
template <typename F>
int expect_value_or_error(F&& parse) {
  static const bool verbose = std::getenv("VIT_FUZZ_VERBOSE") != nullptr;
  try {
    parse();
    if (verbose) std::fprintf(stderr, "accepted\n");
  } catch (const vit::Error& e) {
    if (verbose) std::fprintf(stderr, "vit::Error: %s\n", e.what());
  }
  return 0;
}

}  // namespace vit::fuzz
