// Data parallel with the gradient sums overlapped with the backward pass: the bucket plan
// (train/grad_buckets.h) covers every parameter once, in the stage that finishes it; and an
// engine that starts the sums during the last micro-batch trains bit for bit as one that sums
// in step(), with no collective in the other micro-batches. The world is a stand-in of two
// identical ranks (every sum doubles the data: exact), which records what the engine asked.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "engine_test_util.h"
#include "model/config.h"
#include "model/params.h"
#include "train/engine.h"
#include "train/grad_buckets.h"

namespace {

using vit::Index;
using vit::test::Case;

// Every kind of model: token and pooled classifiers, both FFNs, layer scale, the conv stem.
std::vector<vit::ModelConfig> configs() {
  std::vector<vit::ModelConfig> v;
  for (const Case& k : vit::test::kComparisonCases) {
    v.push_back(vit::test::config_of(k));
    v.back().img_size = 16;  // 4 x 4 tokens: small, quick
  }
  vit::ModelConfig no_bias = v[0];
  no_bias.qkv_bias = false;
  v.push_back(no_bias);
  return v;
}

TEST(GradBuckets, EveryTensorOnceInTheStageThatFinishesIt) {
  for (const vit::ModelConfig& c : configs()) {
    SCOPED_TRACE(c.name + " ffn " + std::to_string(int(c.ffn)) + " stem " +
                 std::to_string(int(c.stem)));
    const vit::ParamTable t = vit::build_param_table(c);
    const vit::GradBuckets buckets(t, c.depth);
    std::vector<int> owner(size_t(t.total), -9);  // the stage whose range holds each element
    for (int stage = c.depth; stage >= -1; --stage) {
      const auto& ranges = buckets.at(stage);
      EXPECT_FALSE(ranges.empty()) << "stage " << stage;
      for (const vit::GradRange& r : ranges) {
        ASSERT_GE(r.offset, 0);
        ASSERT_LE(r.offset + r.count, t.total);
        for (Index i = r.offset; i < r.offset + r.count; ++i) {
          EXPECT_EQ(owner[size_t(i)], -9) << "element " << i << " in two ranges";
          owner[size_t(i)] = stage;
        }
      }
    }
    for (const auto& s : t.specs) {
      const int want = s.name.rfind("blocks.", 0) == 0 ? std::stoi(s.name.substr(7))
                       : s.name.rfind("head.", 0) == 0 || s.name.rfind("norm.", 0) == 0 ||
                               s.name.rfind("fc_norm.", 0) == 0
                           ? c.depth
                           : -1;
      EXPECT_EQ(vit::grad_stage(s.name, c.depth), want) << s.name;
      for (Index i = s.offset; i < s.offset + s.numel(); ++i)
        ASSERT_EQ(owner[size_t(i)], want) << s.name << " element " << i;
    }
    // A block's tensors sit in two runs: the decayed ones and the rest.
    for (int l = 0; l < c.depth; ++l) EXPECT_EQ(buckets.at(l).size(), 2u) << "block " << l;
  }
  EXPECT_THROW(vit::grad_stage("blocks.7.norm1.weight", 3), vit::Error);
}

// Two identical ranks: a sum doubles the data. Logs each call.
class TwinComm : public vit::Comm {
 public:
  struct Call {
    std::string op;
    const void* at = nullptr;  // started sums: where
    Index count = 0;
  };
  std::vector<Call> log;
  size_t pending = 0;
  // Late: a started sum lands only in wait_all() (an engine that reads or writes a range
  // before waiting then sees the rank's own gradient); else at once (one that writes a range
  // after starting its sum adds onto the summed value).
  bool late = false;
  std::vector<std::pair<float*, size_t>> in_flight;

  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "twin"; }
  void allreduce_sum(float* d, size_t n) override {
    twice(d, n);
    log.push_back({"sum", d, Index(n)});
  }
  void allreduce_sum(double* d, size_t n) override {
    twice(d, n);
    log.push_back({"sum", d, Index(n)});
  }
  void allreduce_sum_start(float* d, size_t n) override {
    if (late)
      in_flight.push_back({d, n});
    else
      twice(d, n);
    log.push_back({"start", d, Index(n)});
    ++pending;
  }
  void allreduce_sum_start(double* d, size_t n) override {
    twice(d, n);
    log.push_back({"start", d, Index(n)});
    ++pending;
  }
  void progress() override { log.push_back({"progress"}); }
  void wait_all() override {
    for (const auto& [d, n] : in_flight) twice(d, n);
    in_flight.clear();
    log.push_back({"wait", nullptr, Index(pending)});
    pending = 0;
  }
  void reduce_scatter_sum(float*, size_t) override { fail(); }
  void reduce_scatter_sum(double*, size_t) override { fail(); }
  void allgather(float*, size_t) override { fail(); }
  void allgather(double*, size_t) override { fail(); }
  void broadcast(void*, size_t, int) override { fail(); }

  size_t count(const std::string& op) const {
    return size_t(std::count_if(log.begin(), log.end(), [&](const Call& c) { return c.op == op; }));
  }

 private:
  template <typename T>
  static void twice(T* d, size_t n) {
    for (size_t i = 0; i < n; ++i) d[i] *= 2;
  }
  static void fail() { ADD_FAILURE() << "the engine asked for a ZeRO-1 collective"; }
};

struct DpRun {
  std::shared_ptr<TwinComm> comm = std::make_shared<TwinComm>();
  std::unique_ptr<vit::Engine> engine;
};

DpRun make_run(const vit::ModelConfig& c, Index B, int micro_batches, bool late = false) {
  DpRun r;
  r.comm->late = late;
  vit::EngineOptions o = vit::test::engine_options("cpu", "fp32", c, B);
  o.max_img_size = 20;  // the test moves from 16 to 20 px (a bucket plan for every size)
  o.comm = r.comm;
  o.micro_batches = micro_batches;
  r.engine = vit::make_engine(o);
  return r;
}

void micro_batch(vit::Engine& e, const vit::ModelConfig& c, Index B, uint64_t seed, int accum) {
  const vit::test::Batch b = vit::test::random_batch(c, B, seed);
  e.forward_backward(b.images.data(), b.targets.data(), B, 1.0f / float(accum * B), seed);
}

TEST(OverlappedGradSums, TrainBitwiseAsSumsInStepWithoutCollectivesBeforeTheLastMicroBatch) {
  const Index B = 3;
  for (const vit::ModelConfig& c : configs()) {
    SCOPED_TRACE(c.name + " ffn " + std::to_string(int(c.ffn)) + " stem " +
                 std::to_string(int(c.stem)) + " layer scale " +
                 std::to_string(c.layer_scale_init));
    for (const auto& [accum, late] :
         {std::pair(1, false), std::pair(3, false), std::pair(3, true)}) {
      SCOPED_TRACE("micro-batches " + std::to_string(accum) + (late ? ", sums land late" : ""));
      DpRun plain = make_run(c, B, 0), overlap = make_run(c, B, accum, late);
      vit::ModelConfig cur = c;
      for (int update = 0; update < 3; ++update) {
        if (update != 1) {  // fresh weights at 16 px, then at 20 px: the table moves
          cur.img_size = update == 0 ? 16 : 20;
          std::vector<float> p(size_t(vit::build_param_table(cur).total)), zeros(p.size());
          vit::init_params(p.data(), vit::build_param_table(cur), cur, 11 + update);
          for (DpRun* r : {&plain, &overlap}) {
            r->engine->set_img_size(cur.img_size);
            r->engine->write_params(p);
            r->engine->write_moments(zeros, zeros, r->engine->num_steps());
          }
        }
        const vit::GradBuckets buckets(overlap.engine->table(), c.depth);
        for (DpRun* r : {&plain, &overlap}) {
          r->comm->log.clear();
          r->engine->zero_grad();
          for (int a = 0; a < accum; ++a) {
            micro_batch(*r->engine, cur, B, uint64_t(100 * update + a), accum);
            if (a + 1 < accum) {
              ASSERT_TRUE(r->comm->log.empty()) << "a collective mid-update";
            }
          }
        }
        // The overlapped sums: every bucket once, in the backward pass's order, before step().
        std::vector<vit::GradRange> want;
        for (int stage = c.depth; stage >= -1; --stage)
          for (const vit::GradRange& g : buckets.at(stage)) want.push_back(g);
        // Offsets from the lowest address started: the buffer's start (element 0, the first
        // tensor's, is in some bucket).
        const float* base = nullptr;
        for (const auto& call : overlap.comm->log)
          if (call.op == "start" && (!base || call.at < base))
            base = static_cast<const float*>(call.at);
        std::vector<vit::GradRange> got;
        for (const auto& call : overlap.comm->log) {
          EXPECT_NE(call.op, "sum") << "a blocking sum during the backward pass";
          EXPECT_NE(call.op, "wait");
          if (call.op == "start")
            got.push_back({Index(static_cast<const float*>(call.at) - base), call.count});
        }
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_EQ(got[i].offset, want[i].offset) << "bucket " << i;
          EXPECT_EQ(got[i].count, want[i].count) << "bucket " << i;
        }
        EXPECT_EQ(overlap.comm->count("progress"), size_t(c.depth + 2));
        EXPECT_TRUE(plain.comm->log.empty());
        overlap.comm->log.clear();
        plain.engine->step(1e-3);
        overlap.engine->step(1e-3);
        // step(): the plain engine sums the whole buffer; the overlapped one waits for its
        // sums. Both then average the update's loss.
        ASSERT_EQ(overlap.comm->count("wait"), 1u);
        EXPECT_EQ(overlap.comm->log.front().op, "wait");
        EXPECT_EQ(overlap.comm->count("start"), 0u);
        EXPECT_EQ(overlap.comm->count("sum"), 1u);  // the loss
        EXPECT_EQ(plain.comm->count("sum"), 2u);    // the gradients, the loss
        const vit::TrainStats a = plain.engine->read_stats(), b = overlap.engine->read_stats();
        EXPECT_EQ(a.last_loss, b.last_loss);
        EXPECT_EQ(a.grad_norm, b.grad_norm);
        ASSERT_EQ(plain.engine->read_params(), overlap.engine->read_params())
            << "update " << update;
      }
    }
  }
}

TEST(OverlappedGradSums, FewerMicroBatchesSumInStepAndMoreAreAnError) {
  const vit::ModelConfig c = configs()[0];
  const Index B = 4;
  DpRun r = make_run(c, B, 2);
  r.engine->zero_grad();
  micro_batch(*r.engine, c, B, 1, 2);
  r.engine->step(1e-3);  // one of two: the whole buffer summed in step()
  EXPECT_EQ(r.comm->count("start"), 0u);
  EXPECT_EQ(r.comm->count("sum"), 2u);
  r.engine->zero_grad();
  micro_batch(*r.engine, c, B, 2, 2);
  micro_batch(*r.engine, c, B, 3, 2);
  EXPECT_THROW(micro_batch(*r.engine, c, B, 4, 2), vit::Error);
  // An update abandoned after its sums started: zero_grad() waits for them first.
  r.comm->log.clear();
  r.engine->zero_grad();
  EXPECT_EQ(r.comm->count("wait"), 1u);
  micro_batch(*r.engine, c, B, 5, 2);
  EXPECT_TRUE(r.comm->log.size() == 1u) << "only the wait";
}

}  // namespace
