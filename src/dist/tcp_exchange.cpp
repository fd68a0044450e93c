#include "dist/tcp_exchange.h"

#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/common.h"

namespace vit {

namespace {

using Clock = std::chrono::steady_clock;

// Hello: magic, the sender's rank and the world size it was launched with (a stray job on the
// same port has another size or no magic).
constexpr char kMagic[8] = {'v', 'i', 't', 'r', 'a', 'i', 'n', '1'};
constexpr size_t kHelloBytes = 16;
constexpr uint32_t kMaxBlob = 1 << 20;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

int ms_left(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : int(std::min<long long>(left, 1 << 30));
}

// Waits until fd is readable (or writable); false at the deadline.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

// All n bytes, or false (peer closed, error, deadline).
bool read_all(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return false;
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) return false;
    if (r > 0) p += r, n -= size_t(r);
  }
  return true;
}

bool write_all(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return false;
    const ssize_t r = ::send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0 && errno != EINTR && errno != EAGAIN) return false;
    if (r > 0) p += r, n -= size_t(r);
  }
  return true;
}

void put_u32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = char((v >> (8 * i)) & 0xff);
}
uint32_t get_u32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(p[i])) << (8 * i);
  return v;
}

std::string where(const LaunchEnv& e) {
  return fmt::format("{}:{}", e.master_addr, e.exchange_port);
}

Socket listen_on(const LaunchEnv& e) {
  Socket s(::socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = s.fd() >= 0;
  if (!v6) s = Socket(::socket(AF_INET, SOCK_STREAM, 0));
  VIT_CHECK(s.fd() >= 0, fmt::format("rank 0: socket(): {}", std::strerror(errno)));
  const int one = 1, zero = 0;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(s.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // IPv4 too
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(uint16_t(e.exchange_port));
    rc = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(e.exchange_port));
    rc = ::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  }
  VIT_CHECK(rc == 0 && ::listen(s.fd(), 128) == 0,
            fmt::format("rank 0: cannot listen on port {} (the id exchange's: MASTER_PORT + 1, "
                        "or VIT_EXCHANGE_PORT): {}",
                        e.exchange_port, std::strerror(errno)));
  return s;
}

// Rank 0: accept until every other rank has said hello, then send each the blob.
void serve(const LaunchEnv& e, const std::string& blob, Clock::time_point deadline,
           double timeout_s) {
  Socket listener = listen_on(e);
  std::vector<Socket> peers(size_t(e.size));
  int joined = 1;
  while (joined < e.size) {
    if (!wait_fd(listener.fd(), POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < e.size; ++r)
        if (peers[size_t(r)].fd() < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      throw Error(fmt::format(
          "rank 0: ranks {} did not connect to port {} within {} s (--dist-timeout); did they "
          "start, and can they reach MASTER_ADDR={}?",
          missing, e.exchange_port, timeout_s, e.master_addr));
    }
    Socket c(::accept(listener.fd(), nullptr, nullptr));
    if (c.fd() < 0) continue;
    char hello[kHelloBytes];
    // A short read window per connection, so a silent stray cannot hold up the job.
    const auto hello_deadline = std::min(deadline, Clock::now() + std::chrono::seconds(10));
    if (!read_all(c.fd(), hello, kHelloBytes, hello_deadline) ||
        std::memcmp(hello, kMagic, sizeof kMagic) != 0)
      continue;  // not one of ours
    const uint32_t r = get_u32(hello + 8), n = get_u32(hello + 12);
    VIT_CHECK(n == uint32_t(e.size),
              fmt::format("rank 0: a rank launched with world size {} connected to port {}, this "
                          "job has {} (another job on the same port?)",
                          n, e.exchange_port, e.size));
    VIT_CHECK(r >= 1 && r < n && peers[r].fd() < 0,
              fmt::format("rank 0: rank {} connected twice or is out of range", r));
    peers[r] = std::move(c);
    ++joined;
  }
  char head[4];
  put_u32(head, uint32_t(blob.size()));
  for (int r = 1; r < e.size; ++r) {
    const int fd = peers[size_t(r)].fd();
    VIT_CHECK(write_all(fd, head, 4, deadline) && write_all(fd, blob.data(), blob.size(), deadline),
              fmt::format("rank 0: could not send the job's id to rank {}", r));
  }
}

// Another rank: connect to rank 0 (retrying until it listens), say hello, read the blob.
std::string join(const LaunchEnv& e, Clock::time_point deadline, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(e.exchange_port);
  const int gai = ::getaddrinfo(e.master_addr.c_str(), port.c_str(), &hints, &found);
  VIT_CHECK(gai == 0, fmt::format("rank {}: cannot resolve MASTER_ADDR={}: {}", e.rank,
                                  e.master_addr, ::gai_strerror(gai)));
  Socket s;
  while (s.fd() < 0) {
    for (addrinfo* a = found; a && s.fd() < 0; a = a->ai_next) {
      Socket t(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (t.fd() >= 0 && ::connect(t.fd(), a->ai_addr, a->ai_addrlen) == 0) s = std::move(t);
    }
    if (s.fd() >= 0) break;
    if (ms_left(deadline) == 0) {
      ::freeaddrinfo(found);
      throw Error(
          fmt::format("rank {}: rank 0 did not accept a connection at {} within {} s "
                      "(--dist-timeout); is it running, and is the port reachable?",
                      e.rank, where(e), timeout_s));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_left(deadline))));
  }
  ::freeaddrinfo(found);
  const int one = 1;
  ::setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  char hello[kHelloBytes];
  std::memcpy(hello, kMagic, sizeof kMagic);
  put_u32(hello + 8, uint32_t(e.rank));
  put_u32(hello + 12, uint32_t(e.size));
  char head[4];
  std::string blob;
  bool ok = write_all(s.fd(), hello, kHelloBytes, deadline) && read_all(s.fd(), head, 4, deadline);
  if (ok) {
    const uint32_t n = get_u32(head);
    ok = n <= kMaxBlob;
    if (ok) {
      blob.resize(n);
      ok = read_all(s.fd(), blob.data(), n, deadline);
    }
  }
  VIT_CHECK(ok, fmt::format("rank {}: rank 0 at {} did not send the job's id within {} s "
                            "(--dist-timeout): some rank has not started, or rank 0 failed",
                            e.rank, where(e), timeout_s));
  return blob;
}

}  // namespace

std::string tcp_share_from_rank0(const LaunchEnv& env, const std::string& blob, double timeout_s) {
  VIT_CHECK(blob.size() <= kMaxBlob || env.rank != 0, "tcp exchange: blob too large");
  if (env.size <= 1) return blob;
  const auto deadline = timeout_s > 0
                            ? Clock::now() + std::chrono::milliseconds(long(timeout_s * 1000))
                            : Clock::time_point::max();
  if (env.rank == 0) {
    serve(env, blob, deadline, timeout_s);
    return blob;
  }
  return join(env, deadline, timeout_s);
}

}  // namespace vit
