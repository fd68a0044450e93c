// The rules by which the engine replays its training pass as a CUDA graph (train/pass_graphs.h),
// checked with a stand-in graph policy that records what would run: eager first, captured and
// launched second, replayed after; a new key, a moved scratch epoch or an evicted graph start
// over; a broken capture turns graphs off and the pass still runs, once.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "core/common.h"
#include "train/pass_graphs.h"

namespace {

using vit::PassKey;

// What happened, in order: "eager" (the pass ran outside a capture), "recorded" (inside one),
// "launch:N" (graph N launched).
struct World {
  std::vector<std::string> events;
  bool capturing = false;
  bool break_next_capture = false;  // end_capture reports a broken capture
  bool fail_begin = false;          // begin_capture throws
  bool fail_launch = false;         // Graph::launch throws
  uint64_t epoch = 0;
  int graphs_made = 0;
};
World* g_world = nullptr;

struct FakeOps {
  struct Graph {
    int id = -1;
    bool valid() const { return id >= 0; }
    void launch() const {
      if (g_world->fail_launch) throw vit::Error("CUDA error: launch failed");
      g_world->events.push_back("launch:" + std::to_string(id));
    }
  };
  static void begin_capture() {
    if (g_world->fail_begin) throw vit::Error("CUDA error: capture not permitted");
    EXPECT_FALSE(g_world->capturing);
    g_world->capturing = true;
  }
  static void abort_capture() {
    EXPECT_TRUE(g_world->capturing);
    g_world->capturing = false;
    g_world->events.push_back("aborted");
  }
  static Graph end_capture(std::string* why) {
    EXPECT_TRUE(g_world->capturing);
    g_world->capturing = false;
    if (g_world->break_next_capture) {
      g_world->break_next_capture = false;
      if (why) *why = "operation not permitted when stream is capturing";
      return {};
    }
    return Graph{g_world->graphs_made++};
  }
  static uint64_t epoch() { return g_world->epoch; }
};

class PassGraphsTest : public ::testing::Test {
 protected:
  void SetUp() override { g_world = &world; }
  void TearDown() override { g_world = nullptr; }
  // Runs the pass for `key`; the pass notes whether it ran eagerly or was recorded.
  void run(vit::PassGraphs<FakeOps>& graphs, const PassKey& key) {
    graphs.run(key, [&] { world.events.push_back(world.capturing ? "recorded" : "eager"); });
  }
  std::vector<std::string> take() { return std::exchange(world.events, {}); }
  World world;
  float images[4] = {}, targets[4] = {};
  PassKey key(int slot, vit::Index B = 8, int size = 28, float scale = 0.125f) {
    return PassKey{&images[slot], &targets[slot], B, size, scale, false};
  }
};

using Events = std::vector<std::string>;

TEST_F(PassGraphsTest, EagerThenCapturedAndLaunchedThenReplayed) {
  vit::PassGraphs<FakeOps> graphs;
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"eager"}));
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"recorded", "launch:0"}));  // captured, then run by its launch
  for (int i = 0; i < 3; ++i) {
    run(graphs, key(0));
    EXPECT_EQ(take(), Events({"launch:0"}));
  }
  EXPECT_EQ(graphs.captures(), 1);
  EXPECT_EQ(graphs.replays(), 3);
  EXPECT_TRUE(graphs.enabled());
}

TEST_F(PassGraphsTest, EachKeyHasItsOwnGraph) {
  vit::PassGraphs<FakeOps> graphs;
  // Two input slots in turn (the engine's double buffer), then a partial last batch, a new
  // image size, another loss scale and stochastic depth: each a key of its own.
  for (int i = 0; i < 2; ++i) run(graphs, key(0)), run(graphs, key(1));
  EXPECT_EQ(take(), Events({"eager", "eager", "recorded", "launch:0", "recorded", "launch:1"}));
  run(graphs, key(0));
  run(graphs, key(1));
  EXPECT_EQ(take(), Events({"launch:0", "launch:1"}));
  PassKey dp = key(0);
  dp.drop_path = true;
  for (const PassKey& k : {key(0, 5), key(0, 8, 16), key(0, 8, 28, 0.25f), dp}) {
    run(graphs, k);
    EXPECT_EQ(take(), Events({"eager"}));
  }
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"launch:0"}));  // the old graphs stay
}

TEST_F(PassGraphsTest, AFreedScratchBufferForgetsEveryGraph) {
  vit::PassGraphs<FakeOps> graphs;
  run(graphs, key(0));
  run(graphs, key(0));
  take();
  ++world.epoch;  // release_scratch() freed memory a graph may name
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"eager"}));
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"recorded", "launch:1"}));
}

TEST_F(PassGraphsTest, TheLeastRecentlyUsedGraphGoesFirst) {
  vit::PassGraphs<FakeOps> graphs(2);
  for (int s : {0, 0, 1, 1}) run(graphs, key(s));
  take();
  run(graphs, key(0));  // key 0 is now the more recent
  run(graphs, key(2));  // a third key evicts key 1
  run(graphs, key(0));
  run(graphs, key(1));
  EXPECT_EQ(take(), Events({"launch:0", "eager", "launch:0", "eager"}));
}

TEST_F(PassGraphsTest, ABrokenCaptureTurnsGraphsOffAndThePassStillRunsOnce) {
  vit::PassGraphs<FakeOps> graphs;
  run(graphs, key(0));
  take();
  world.break_next_capture = true;
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"recorded", "eager"}));  // the recording was dropped: run for real
  EXPECT_FALSE(graphs.enabled());
  EXPECT_NE(graphs.off_reason().find("not permitted"), std::string::npos) << graphs.off_reason();
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"eager"}));
  EXPECT_FALSE(world.capturing);
}

// turn_on (Engine::drop_graphs, bench --variant's next variant) after a broken capture: graphs
// on again, no reason left, and the key starts over (eager, then captured and launched, then
// replayed); a capture that breaks again turns them off again.
TEST_F(PassGraphsTest, TurnOnAfterABrokenCaptureStartsTheKeysOver) {
  vit::PassGraphs<FakeOps> graphs;
  run(graphs, key(0));
  world.break_next_capture = true;
  run(graphs, key(0));
  ASSERT_FALSE(graphs.enabled());
  take();
  graphs.turn_on();
  EXPECT_TRUE(graphs.enabled());
  EXPECT_EQ(graphs.off_reason(), "");
  run(graphs, key(0));
  run(graphs, key(0));
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"eager", "recorded", "launch:0", "launch:0"}));
  EXPECT_EQ(graphs.captures(), 1);
  EXPECT_EQ(graphs.replays(), 1);
  graphs.turn_on();  // graphs on already: only forgets them
  run(graphs, key(0));
  world.break_next_capture = true;
  run(graphs, key(0));
  EXPECT_EQ(take(), Events({"eager", "recorded", "eager"}));
  EXPECT_FALSE(graphs.enabled());
}

TEST_F(PassGraphsTest, APassThatThrowsWhileCapturingEndsTheCaptureAndRunsEagerly) {
  vit::PassGraphs<FakeOps> graphs;
  run(graphs, key(0));
  take();
  int calls = 0;
  graphs.run(key(0), [&] {
    world.events.push_back(world.capturing ? "recorded" : "eager");
    if (++calls == 1)
      throw vit::Error("CUDA error: operation not permitted when stream is capturing");
  });
  EXPECT_FALSE(world.capturing);  // the capture was ended before the eager run
  EXPECT_EQ(take(), Events({"recorded", "aborted", "eager"}));
  EXPECT_FALSE(graphs.enabled());
  EXPECT_NE(graphs.off_reason().find("threw while capturing"), std::string::npos);
  // A pass that fails for real fails eagerly too, and the error reaches the caller.
  vit::PassGraphs<FakeOps> again;
  run(again, key(1));
  EXPECT_THROW(again.run(key(1), [] { throw vit::Error("a real error"); }), vit::Error);
  EXPECT_FALSE(world.capturing);
}

TEST_F(PassGraphsTest, ACaptureThatCannotStartOrLaunchTurnsGraphsOffAndRunsThePassOnce) {
  for (bool begin : {true, false}) {
    vit::PassGraphs<FakeOps> graphs;
    run(graphs, key(0));
    take();
    world.fail_begin = begin;
    world.fail_launch = !begin;
    run(graphs, key(0));
    EXPECT_EQ(take(), begin ? Events({"eager"}) : Events({"recorded", "eager"}));
    EXPECT_FALSE(graphs.enabled());
    EXPECT_NE(graphs.off_reason().find(begin ? "did not start" : "did not launch"),
              std::string::npos)
        << graphs.off_reason();
    EXPECT_EQ(graphs.captures(), 0);
    EXPECT_FALSE(world.capturing);
    world.fail_begin = world.fail_launch = false;
  }
}

TEST(PassKey, ComparesTheLossScaleBitsAndEveryField) {
  float a = 0, b = 0;
  const PassKey k{&a, &b, 4, 32, 0.25f, false};
  PassKey o = k;
  EXPECT_TRUE(k == o);
  o.loss_scale = -0.0f;
  PassKey z = k;
  z.loss_scale = 0.0f;
  EXPECT_FALSE(z == o);  // equal as floats, different bits: a kernel could tell them apart
  for (int f = 0; f < 5; ++f) {
    PassKey d = k;
    if (f == 0) d.images = &b;
    if (f == 1) d.targets = &a;
    if (f == 2) d.batch = 5;
    if (f == 3) d.img_size = 16;
    if (f == 4) d.drop_path = true;
    EXPECT_FALSE(k == d) << "field " << f;
  }
}

}  // namespace
