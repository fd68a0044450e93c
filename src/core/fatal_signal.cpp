#include "core/fatal_signal.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

namespace vit {

namespace {

// The handler may only use async-signal-safe calls: the message is built from fixed buffers.
constexpr int kSlots = 4;
constexpr size_t kPathBytes = 512;
char g_mapped[kSlots][kPathBytes];
std::atomic<int> g_next{0};

void write_str(const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(STDERR_FILENO, s, n);
    if (w <= 0) return;
    s += w;
    n -= size_t(w);
  }
}

extern "C" void on_sigbus(int) {
  write_str(
      "error: a memory-mapped data file could not be read (SIGBUS: truncated or changed "
      "while training?):");
  bool any = false;
  for (int i = 0; i < kSlots; ++i)
    if (g_mapped[i][0] != '\0') {
      write_str(any ? ", " : " ");
      write_str(g_mapped[i]);
      any = true;
    }
  write_str("; the last checkpoint is intact (resume once the data is restored)\n");
  ::_exit(1);
}

}  // namespace

void install_fatal_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_sigbus;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGBUS, &sa, nullptr);
  ::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG, which is reported
}

void note_mapped_file(const std::string& path) {
  const int slot = g_next.fetch_add(1) % kSlots;
  char* dst = g_mapped[slot];
  dst[0] = '\0';  // never a half-written name: cleared, filled, then terminated
  const size_t n = std::min(path.size(), kPathBytes - 1);
  std::memcpy(dst + 1, path.data() + 1, n > 0 ? n - 1 : 0);
  dst[n] = '\0';
  if (n > 0) dst[0] = path[0];
}

}  // namespace vit
