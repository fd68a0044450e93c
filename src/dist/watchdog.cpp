#include "dist/watchdog.h"

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

namespace vit {

WatchClock real_clock() {
  WatchClock c;
  c.now_s = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  c.sleep_s = [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };
  return c;
}

PollState poll_until(const std::function<PollState()>& poll, double timeout_s,
                     const WatchClock& clock, double interval_s) {
  const double t0 = clock.now_s();
  for (;;) {
    const PollState s = poll();
    if (s != PollState::Pending) return s;
    if (timeout_s > 0 && clock.now_s() - t0 > timeout_s) return PollState::Pending;
    clock.sleep_s(interval_s);
  }
}

bool run_with_deadline(std::function<void()> work, double grace_s, const WatchClock& clock) {
  // Shared with the thread, which may outlive this call.
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::thread t([work = std::move(work), finished] {
    work();
    *finished = true;
  });
  const PollState s =
      poll_until([&] { return finished->load() ? PollState::Done : PollState::Pending; }, grace_s,
                 clock, 0.01);
  if (s == PollState::Done) {
    t.join();
    return true;
  }
  t.detach();
  return false;
}

Watchdog::Watchdog(int rank, std::string what, Hooks hooks, WatchClock clock, double tick_s,
                   double abort_grace_s)
    : rank_(rank),
      what_(std::move(what)),
      hooks_(std::move(hooks)),
      clock_(std::move(clock)),
      abort_grace_s_(abort_grace_s) {
  if (!hooks_.exit) hooks_.exit = [](int code) { std::_Exit(code); };
  if (tick_s <= 0) return;
  thread_ = std::thread([this, tick_s] {
    if (hooks_.on_thread_start) hooks_.on_thread_start();
    while (!stop_) {
      clock_.sleep_s(tick_s);
      check();
    }
  });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Watchdog::begin(const char* op) {
  std::lock_guard<std::mutex> lock(mu_);
  op_ = op;
  start_s_ = clock_.now_s();
}

void Watchdog::end() {
  std::lock_guard<std::mutex> lock(mu_);
  start_s_ = -1;
}

std::string Watchdog::last_message() const {
  std::lock_guard<std::mutex> lock(mu_);
  return message_;
}

bool Watchdog::check() {
  std::string why;
  const char* op;
  double waited;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (start_s_ < 0) return false;
    op = op_;
    waited = clock_.now_s() - start_s_;
    const PollState s = hooks_.poll(&why);
    if (s == PollState::Done) {
      start_s_ = -1;
      return false;
    }
    if (s == PollState::Pending) {
      const long long limit = timeout_ms_;
      if (limit <= 0 || waited * 1000 <= double(limit)) return false;
    }
  }
  const double limit_s = double(timeout_ms_.load()) / 1000.0;
  fail(why.empty()
           ? fmt::format("vitrain: rank {}: {} {} did not finish within {:g} s (--dist-timeout): "
                         "another rank died or hangs; ending this rank",
                         rank_, what_, op, limit_s)
           : fmt::format("vitrain: rank {}: {} {} failed after {:.1f} s: {}; ending this rank",
                         rank_, what_, op, waited, why));
  return true;
}

void Watchdog::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    message_ = message;
    start_s_ = -1;
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
  if (hooks_.abort && !run_with_deadline(hooks_.abort, abort_grace_s_, clock_)) {
    std::fprintf(stderr,
                 "vitrain: rank %d: %s abort did not return within %g s; exiting without it\n",
                 rank_, what_.c_str(), abort_grace_s_);
    std::fflush(stderr);
  }
  hooks_.exit(3);
}

}  // namespace vit
