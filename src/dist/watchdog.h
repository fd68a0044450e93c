// The deadline logic of a communicator's collectives, apart from NCCL and CUDA so that tests can
// drive it with a fake clock and fake poll functions on the CPU (tests/test_dist_watchdog.cpp).
//  * poll_until: waits for something a poll function reports (NCCL's non-blocking init, an
//    enqueue that returned ncclInProgress) up to a timeout.
//  * run_with_deadline: runs an abort on a thread of its own and gives up on it after a grace
//    period (ncclCommAbort can block on a wedged GPU).
//  * Watchdog: one pending collective at a time, marked from before it is enqueued; a thread
//    polls it, and past the timeout, or when the poll reports a failure (NCCL's async error), it
//    prints one line naming the operation, aborts under a hard deadline and ends the process.
#pragma once
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace vit {

enum class PollState { Pending, Done, Failed };

struct WatchClock {
  std::function<double()> now_s;        // a monotonic clock, seconds
  std::function<void(double)> sleep_s;  // waits about that long
};
WatchClock real_clock();

// Polls until `poll` says Done or Failed (returned), or `timeout_s` passes (Pending); 0 waits
// forever. Sleeps `interval_s` between polls.
PollState poll_until(const std::function<PollState()>& poll, double timeout_s,
                     const WatchClock& clock, double interval_s = 0.001);

// Runs `work` on a thread of its own; true when it returned within `grace_s`. A thread still
// stuck then is left behind (detached): the caller is about to end the process.
bool run_with_deadline(std::function<void()> work, double grace_s, const WatchClock& clock);

class Watchdog {
 public:
  struct Hooks {
    std::function<void()> on_thread_start;  // e.g. select this rank's device on the thread
    // The pending collective: Done, still Pending, or Failed (`why` says how).
    std::function<PollState(std::string* why)> poll;
    std::function<void()> abort;  // ends the communicator's collectives on every rank it can
    // Ends the process; the default prints nothing more and calls std::_Exit(code).
    std::function<void(int code)> exit;
  };
  // `what`: "NCCL"; `abort_grace_s`: how long the abort may take before the process ends
  // without it. Starts the polling thread when `tick_s` > 0 (tests pass 0 and call check()).
  Watchdog(int rank, std::string what, Hooks hooks, WatchClock clock, double tick_s,
           double abort_grace_s = 10.0);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void set_timeout(double seconds) { timeout_ms_ = (long long)(seconds * 1000); }
  // `op` is pending from now (call before enqueuing it); replaces an earlier pending one.
  void begin(const char* op);
  // Nothing is pending (the caller saw it finish).
  void end();
  // One look: false when nothing was pending or it is still within its time; on a timeout or a
  // failure it reports, aborts and calls hooks.exit (which returns only in tests): true then.
  bool check();
  // The line check() printed last ("" if none): for tests.
  std::string last_message() const;

 private:
  void fail(const std::string& message);

  const int rank_;
  const std::string what_;
  Hooks hooks_;
  WatchClock clock_;
  const double abort_grace_s_;
  mutable std::mutex mu_;  // op_, start_s_, message_
  const char* op_ = "";
  double start_s_ = -1;  // < 0: nothing pending
  std::string message_;
  std::atomic<long long> timeout_ms_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace vit
