#include "io/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/common.h"

namespace vit::io {

namespace {

[[noreturn]] void fail_write(const std::string& path, const char* step, int err) {
  throw Error(fmt::format("cannot write '{}' ({}): {}", path, step, std::strerror(err)));
}

}  // namespace

void write_file_atomic(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());

  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_write(path, "create temp file", errno);
  // Any failure from here on: keep errno, drop the temp file, report.
  auto abandon = [&](const char* step, int err, bool close_fd) {
    if (close_fd) ::close(fd);
    ::unlink(tmp.c_str());
    fail_write(path, step, err);
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) abandon("write", n < 0 ? errno : EIO, true);
    done += size_t(n);
  }
  if (::fsync(fd) != 0) abandon("fsync", errno, true);
  if (::close(fd) != 0) abandon("close", errno, false);
  if (::rename(tmp.c_str(), path.c_str()) != 0) abandon("rename", errno, false);
  // Persist the rename itself; the new file is already complete, so this is best effort.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  auto fail = [&](int err) {
    ::close(fd);
    throw Error(fmt::format("cannot read '{}': {}", path, std::strerror(err)));
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(errno);
  if (S_ISDIR(st.st_mode)) fail(EISDIR);
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(size_t(st.st_size));
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(errno);
    if (n == 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fd);
  return out;
}

int remove_stale_temp_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || at + 5 == name.size()) continue;
    const std::string pid_text = name.substr(at + 5);
    if (pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9)
      continue;
    const pid_t pid = pid_t(std::stol(pid_text));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive
    if (entry.is_regular_file(ec) && fs::remove(entry.path(), ec)) ++removed;
  }
  return removed;
}

}  // namespace vit::io
