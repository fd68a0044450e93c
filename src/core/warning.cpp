#include "core/warning.h"

#include <atomic>

namespace vit {

namespace {

std::atomic<std::FILE*> g_log{nullptr};

void write_line(std::FILE* f, const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), f);  // one call: the stream's lock keeps it whole
  std::fflush(f);
}

}  // namespace

void warn(const std::string& text) {
  const std::string line = "warning: " + text + "\n";
  write_line(stderr, line);
  if (std::FILE* log = g_log.load()) write_line(log, line);
}

void set_warning_log(std::FILE* log) {
  g_log.store(log);
}

}  // namespace vit
