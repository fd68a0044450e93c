// The deadline logic of the NCCL communicator (dist/watchdog.h) on the CPU, with a fake clock
// and fake poll, abort and exit functions: what a hung peer, NCCL's async error and a wedged
// ncclCommAbort would make of a rank.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include "dist/watchdog.h"

namespace {

using vit::PollState;

// Seconds that pass only when someone sleeps (each sleep also yields a little real time, so
// helper threads run).
struct FakeClock {
  std::atomic<double> t{100.0};
  vit::WatchClock clock() {
    vit::WatchClock c;
    c.now_s = [this] { return t.load(); };
    c.sleep_s = [this](double s) {
      t = t.load() + s;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    };
    return c;
  }
};

TEST(PollUntil, ReturnsWhatThePollSaysOrPendingAtTheTimeout) {
  FakeClock fc;
  int calls = 0;
  EXPECT_EQ(vit::poll_until([&] { return ++calls < 5 ? PollState::Pending : PollState::Done; },
                            10.0, fc.clock(), 0.5),
            PollState::Done);
  EXPECT_EQ(calls, 5);
  EXPECT_EQ(vit::poll_until([] { return PollState::Failed; }, 10.0, fc.clock()), PollState::Failed);
  const double t0 = fc.t;
  EXPECT_EQ(vit::poll_until([] { return PollState::Pending; }, 3.0, fc.clock(), 0.5),
            PollState::Pending);
  EXPECT_GT(fc.t - t0, 3.0);
  EXPECT_LT(fc.t - t0, 4.0);
}

TEST(RunWithDeadline, GivesUpOnAStuckAbort) {
  FakeClock fc;
  std::atomic<bool> ran{false};
  EXPECT_TRUE(vit::run_with_deadline([&] { ran = true; }, 1000.0, fc.clock()));
  EXPECT_TRUE(ran);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  EXPECT_FALSE(vit::run_with_deadline([gate] { gate.wait(); }, 5.0, fc.clock()));
  release.set_value();  // the left-behind thread ends
}

struct Probe {
  std::atomic<PollState> state{PollState::Pending};
  std::string why;
  std::atomic<int> polls{0}, aborts{0}, exits{0}, exit_code{0};
  std::atomic<bool> wedge_abort{false};
  std::promise<void> unwedge;
  std::shared_future<void> gate{unwedge.get_future().share()};

  vit::Watchdog::Hooks hooks() {
    vit::Watchdog::Hooks h;
    h.poll = [this](std::string* w) {
      ++polls;
      if (state == PollState::Failed) *w = why;
      return state.load();
    };
    h.abort = [this] {
      ++aborts;
      if (wedge_abort) gate.wait();
    };
    h.exit = [this](int code) {
      exit_code = code;
      ++exits;
    };
    return h;
  }
};

TEST(Watchdog, NothingPendingNeverEnds) {
  FakeClock fc;
  Probe p;
  vit::Watchdog w(0, "NCCL", p.hooks(), fc.clock(), 0);
  w.set_timeout(5);
  fc.t = fc.t + 1000;
  EXPECT_FALSE(w.check());
  EXPECT_EQ(p.polls, 0);
  EXPECT_EQ(p.exits, 0);
}

TEST(Watchdog, TimeoutCountsFromBeforeTheEnqueue) {
  FakeClock fc;
  Probe p;
  vit::Watchdog w(1, "NCCL", p.hooks(), fc.clock(), 0);
  w.set_timeout(5);
  w.begin("broadcast");  // a blocking enqueue or host copy may follow: the clock runs already
  fc.t = fc.t + 4.9;
  EXPECT_FALSE(w.check());
  EXPECT_EQ(p.exits, 0);
  fc.t = fc.t + 0.2;
  EXPECT_TRUE(w.check());
  EXPECT_EQ(p.aborts, 1);
  EXPECT_EQ(p.exits, 1);
  EXPECT_EQ(p.exit_code, 3);
  EXPECT_NE(w.last_message().find("rank 1: NCCL broadcast did not finish within 5 s "
                                  "(--dist-timeout)"),
            std::string::npos)
      << w.last_message();
}

TEST(Watchdog, DoneClearsAndEndForgets) {
  FakeClock fc;
  Probe p;
  vit::Watchdog w(0, "NCCL", p.hooks(), fc.clock(), 0);
  w.set_timeout(5);
  w.begin("all-reduce");
  p.state = PollState::Done;
  EXPECT_FALSE(w.check());
  p.state = PollState::Pending;
  fc.t = fc.t + 100;
  EXPECT_FALSE(w.check()) << "a finished collective is not watched any more";
  w.begin("all-gather");
  w.end();
  fc.t = fc.t + 100;
  EXPECT_FALSE(w.check());
  w.set_timeout(0);  // 0 = wait forever
  w.begin("all-reduce");
  fc.t = fc.t + 1e6;
  EXPECT_FALSE(w.check());
  EXPECT_EQ(p.exits, 0);
}

TEST(Watchdog, AsyncErrorEndsTheRankAtOnce) {
  FakeClock fc;
  Probe p;
  vit::Watchdog w(2, "NCCL", p.hooks(), fc.clock(), 0);
  w.set_timeout(600);
  w.begin("reduce-scatter");
  p.why = "NCCL reports remote process exited or there was a network error";
  p.state = PollState::Failed;
  EXPECT_TRUE(w.check());
  EXPECT_EQ(p.exits, 1);
  EXPECT_NE(w.last_message().find("rank 2: NCCL reduce-scatter failed after 0.0 s: NCCL reports "
                                  "remote process exited"),
            std::string::npos)
      << w.last_message();
}

TEST(Watchdog, WedgedAbortStillExitsAfterTheGrace) {
  FakeClock fc;
  Probe p;
  p.wedge_abort = true;
  vit::Watchdog w(0, "NCCL", p.hooks(), fc.clock(), 0, /*abort_grace_s=*/2.0);
  w.set_timeout(1);
  w.begin("all-reduce (overlapped)");
  fc.t = fc.t + 2;
  EXPECT_TRUE(w.check());  // returns: the abort is left behind
  EXPECT_EQ(p.aborts, 1);
  EXPECT_EQ(p.exits, 1);
  p.unwedge.set_value();
}

TEST(Watchdog, ItsThreadSelectsTheDeviceAndEndsAHungCollective) {
  Probe p;
  std::atomic<int> started{0};
  vit::Watchdog::Hooks h = p.hooks();
  h.on_thread_start = [&] { ++started; };
  vit::Watchdog w(0, "NCCL", h, vit::real_clock(), 0.01);
  w.set_timeout(0.05);
  w.begin("broadcast");
  for (int i = 0; i < 500 && p.exits == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(started, 1);
  EXPECT_EQ(p.exits, 1);
}

}  // namespace
