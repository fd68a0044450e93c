// ZeRO-1's partition on equal padded blocks (dist/comm.h's shard_block), checked in one process:
// a world of three ranks as three threads (ThreadWorld) whose collectives check what the engine
// hands them. The blocks are equal, a multiple of 64 and the fewest that hold the table; the
// padding past the table is zero in every reduce-scatter and all-gather and in the buffers
// afterwards (a curriculum switch to a smaller table included); the sharded engines train as
// plain data parallel does; and reading the moments gathers every rank's block exactly, in
// pieces whose staging stays within 1 MiB.
#include <gtest/gtest.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/host.h"
#include "dist/comm.h"
#include "engine_test_util.h"
#include "model/params.h"
#include "train/engine.h"
#include "train/engine_impl.h"

namespace {

using vit::Index;
using CpuEngine = vit::ModelEngine<vit::CpuBackend<float>>;

// What one rank handed a ZeRO-1 collective.
struct Call {
  std::string op;
  size_t block = 0;
  bool padding_zero = true;  // the elements past `total` of the (size, block) buffer
};

// The ranks of a world in threads of one process. Each rank computes only while it holds the
// world's lock (one at a time: the BLAS and the test's CPU share), and lets go of it inside a
// collective. Sums run in rank order. A reduce-scatter fills the other ranks' blocks with a
// marker afterwards, as MPI may leave scratch there.
class ThreadWorld {
 public:
  explicit ThreadWorld(int size)
      : size_(size), total(size_t(size)), calls(size_t(size)), at_(size_t(size)), sync_(size) {}
  int size() const { return size_; }

 private:
  int size_;

 public:
  std::vector<size_t> total;             // per rank: its table's elements, before the padding
  std::vector<std::vector<Call>> calls;  // per rank, since the last run()
  std::mutex lock;                       // held by the rank that computes

  // f(rank) on `size` threads, each holding the lock outside collectives.
  void run(const std::function<void(int)>& f) {
    calls.assign(size_t(size_), {});
    std::vector<std::thread> ranks;
    for (int r = 0; r < size_; ++r)
      ranks.emplace_back([this, &f, r] {
        std::unique_lock<std::mutex> hold(lock);
        f(r);
      });
    for (auto& t : ranks) t.join();
  }

  // One collective: every rank posts `data`, then `step(rank)` runs on each between barriers
  // (without the lock), so no rank changes its buffer while another reads it.
  void collective(int rank, void* data, const std::function<void()>& step) {
    lock.unlock();
    at_[size_t(rank)] = data;
    sync_.arrive_and_wait();
    step();
    sync_.arrive_and_wait();
    lock.lock();
  }
  template <typename T>
  T* at(int r) const {
    return static_cast<T*>(at_[size_t(r)]);
  }

 private:
  std::vector<void*> at_;
  std::barrier<> sync_;
};

constexpr float kScratch = 12345.0f;  // what a reduce-scatter leaves in the other blocks

class ThreadComm : public vit::Comm {
 public:
  ThreadComm(ThreadWorld& w, int rank) : w_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_.size(); }
  std::string name() const override { return "threads"; }
  void allreduce_sum(float* d, size_t n) override { sum(d, n); }
  void allreduce_sum(double* d, size_t n) override { sum(d, n); }
  void reduce_scatter_sum(float* d, size_t block) override { reduce_scatter(d, block); }
  void reduce_scatter_sum(double* d, size_t block) override { reduce_scatter(d, block); }
  void allgather(float* d, size_t block) override { gather(d, block); }
  void allgather(double* d, size_t block) override { gather(d, block); }
  void broadcast(void* d, size_t n, int root) override {
    w_.collective(rank_, d, [&] {
      if (rank_ != root) std::memcpy(d, w_.at<void>(root), n);
    });
  }

 private:
  template <typename T>
  void sum(T* d, size_t n) {
    std::vector<T> s(n, T(0));
    w_.collective(rank_, d, [&] {
      for (int q = 0; q < size(); ++q)
        for (size_t i = 0; i < n; ++i) s[i] += w_.at<T>(q)[i];
    });
    w_.collective(rank_, d, [&] { std::copy(s.begin(), s.end(), d); });
  }
  template <typename T>
  void reduce_scatter(T* d, size_t block) {
    record("reduce-scatter", d, block);
    const size_t lo = size_t(rank_) * block;
    std::vector<T> s(block, T(0));
    w_.collective(rank_, d, [&] {
      for (int q = 0; q < size(); ++q)
        for (size_t i = 0; i < block; ++i) s[i] += w_.at<T>(q)[lo + i];
    });
    w_.collective(rank_, d, [&] {
      std::fill(d, d + size_t(size()) * block, T(kScratch));
      std::copy(s.begin(), s.end(), d + lo);
    });
  }
  template <typename T>
  void gather(T* d, size_t block) {
    record("all-gather", d, block);
    w_.collective(rank_, d, [&] {
      for (int q = 0; q < size(); ++q)
        if (q != rank_) std::copy_n(w_.at<T>(q) + size_t(q) * block, block, d + size_t(q) * block);
    });
    record("all-gather (after)", d, block);
  }
  template <typename T>
  void record(const char* op, const T* d, size_t block) {
    Call c{op, block, true};
    for (size_t i = w_.total[size_t(rank_)]; i < size_t(size()) * block; ++i)
      c.padding_zero &= d[i] == T(0);
    w_.calls[size_t(rank_)].push_back(c);
  }

  ThreadWorld& w_;
  int rank_;
};

vit::ModelConfig model() {
  vit::ModelConfig c = vit::test::config_of(vit::test::kComparisonCases[0]);
  c.img_size = 24;  // 6 x 6 tokens; the run's largest is 28
  return c;
}

vit::ModelConfig with_size(int img_size) {
  vit::ModelConfig c = model();
  c.img_size = img_size;
  return c;
}

std::vector<float> initial(const vit::ModelConfig& c, uint64_t seed) {
  const vit::ParamTable t = vit::build_param_table(c);
  std::vector<float> p(size_t(t.total));
  vit::init_params(p.data(), t, c, seed);
  return p;
}

// Three ranks, each its own batch of B, over the thread world: ZeRO-1 or plain data parallel.
struct Ranks {
  ThreadWorld world{3};
  std::vector<std::unique_ptr<CpuEngine>> engines = std::vector<std::unique_ptr<CpuEngine>>(3);
  explicit Ranks(bool zero1, Index B) {
    world.run([&](int r) {
      vit::EngineOptions o = vit::test::engine_options("cpu", "fp32", model(), B);
      o.adamw.eps = vit::test::kComparisonAdamEps;
      o.max_img_size = 28;
      o.comm = std::make_shared<ThreadComm>(world, r);
      o.shard_optimizer = zero1;
      engines[size_t(r)] = std::make_unique<CpuEngine>(o);
    });
  }
  // Updates at 28 px, then at 24 px (the table shrinks; its old tail must not become padding).
  // Returns each update's loss (rank 0's view) and each rank's weights at the end.
  std::vector<double> train(Index B, std::vector<std::vector<float>>* weights) {
    std::vector<double> losses;
    weights->assign(3, {});
    world.run([&](int r) {
      CpuEngine& e = *engines[size_t(r)];
      vit::ModelConfig c = model();
      for (int update = 0; update < 3; ++update) {
        if (update < 2) {
          c.img_size = update == 0 ? 28 : 24;
          e.set_img_size(c.img_size);
          const std::vector<float> p = initial(c, 7 + update), zeros(p.size(), 0.0f);
          e.write_params(p);
          e.write_moments(zeros, zeros, e.num_steps());
          world.total[size_t(r)] = size_t(e.table().total);
        }
        e.zero_grad();
        const vit::test::Batch b = vit::test::random_batch(c, B, uint64_t(100 * update + r));
        e.forward_backward(b.images.data(), b.targets.data(), B, 1.0f / float(3 * B), 1);
        e.step(1e-3);
        const vit::TrainStats s = e.read_stats();
        if (r == 0) losses.push_back(s.last_loss);
      }
      e.zero_grad();  // the reduce-scatter's scratch in the other blocks goes
      (*weights)[size_t(r)] = e.read_params();
    });
    return losses;
  }
};

// Elements [from, to) of a host buffer are all zero.
bool zeros(const std::vector<float>& x, size_t from, size_t to) {
  return std::all_of(x.begin() + long(from), x.begin() + long(to), [](float v) { return v == 0; });
}

TEST(Zero1, ShardBlockIsTheFewestEqualMultiplesOf64) {
  EXPECT_EQ(vit::shard_block(1000, 3), 384u);  // 3 x 320 < 1000 <= 3 x 384
  EXPECT_EQ(vit::shard_block(192, 3), 64u);
  EXPECT_EQ(vit::shard_block(193, 3), 128u);
  EXPECT_EQ(vit::shard_block(100, 1), 128u);
  EXPECT_EQ(vit::shard_block(0, 2), 0u);
}

TEST(Zero1, EqualBlocksZeroPaddingAndThePlainDataParallelUpdate) {
  const Index B = 2;
  Ranks zero1(true, B), plain(false, B);
  std::vector<std::vector<float>> wz, wp;
  const std::vector<double> lz = zero1.train(B, &wz), lp = plain.train(B, &wp);
  const size_t total = zero1.world.total[0], world = 3;
  ASSERT_NE(total % (world * 64), 0u) << "the test needs a table that leaves padding";
  const size_t block = vit::shard_block(total, 3);
  // Every ZeRO-1 collective of the updates (at 28 px, then 24): the same equal block on every
  // rank, the fewest for the table, zero padding in the reduce-scatter and the all-gather (before
  // and after).
  const size_t block28 = vit::shard_block(size_t(vit::build_param_table(with_size(28)).total), 3);
  for (size_t r = 0; r < world; ++r) {
    const std::vector<Call>& calls = zero1.world.calls[r];
    ASSERT_EQ(calls.size(), 3u * 3u) << "a reduce-scatter and an all-gather per update";
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].block, i < 3 ? block28 : block) << "rank " << r << " call " << i;
      EXPECT_TRUE(calls[i].padding_zero) << "rank " << r << ": " << calls[i].op << " " << i;
    }
  }
  // The buffers: a multiple of the whole padded length, zero past the table on every rank.
  for (size_t r = 0; r < world; ++r) {
    auto& m = zero1.engines[r]->model();
    std::vector<float> p(m.params.size()), g(m.grads.size());
    std::copy(m.params.data(), m.params.data() + p.size(), p.begin());
    std::copy(m.grads.data(), m.grads.data() + g.size(), g.begin());
    EXPECT_EQ(p.size() % (world * 64), 0u);
    EXPECT_GE(p.size(), world * block);
    EXPECT_TRUE(zeros(p, total, p.size())) << "rank " << r << ": weights past the table";
    EXPECT_TRUE(zeros(g, total, world * block)) << "rank " << r << ": gradient padding";
    EXPECT_EQ(wz[r], wz[0]) << "rank " << r << " holds other weights";
  }
  // The same update as plain data parallel: the same gradient sums, the norm summed by block.
  ASSERT_EQ(lz.size(), lp.size());
  for (size_t u = 0; u < lz.size(); ++u) EXPECT_NEAR(lz[u], lp[u], 1e-6 * std::fabs(lp[u]));
  const vit::ParamTable t = vit::build_param_table(model());
  for (const auto& s : t.specs)
    EXPECT_LE(vit::test::tensor_rel_err(wz[0], wp[0], s.offset, s.numel()), 1e-5) << s.name;
  // Each rank's moments gathered: those of plain data parallel, on every rank.
  std::vector<std::vector<float>> mz(world), vz(world), mp(world), vp(world);
  zero1.world.run(
      [&](int r) { zero1.engines[size_t(r)]->read_moments(mz[size_t(r)], vz[size_t(r)]); });
  plain.world.run(
      [&](int r) { plain.engines[size_t(r)]->read_moments(mp[size_t(r)], vp[size_t(r)]); });
  for (size_t r = 0; r < world; ++r) {
    ASSERT_EQ(mz[r].size(), total);
    EXPECT_EQ(mz[r], mz[0]);
    EXPECT_EQ(vz[r], vz[0]);
  }
  for (const auto& s : t.specs) {
    if (s.name.find("attn.qkv.bias") != std::string::npos) continue;  // near-zero: noise
    EXPECT_LE(vit::test::tensor_rel_err(mz[0], mp[0], s.offset, s.numel()), 1e-5) << s.name;
    EXPECT_LE(vit::test::tensor_rel_err(vz[0], vp[0], s.offset, s.numel()), 1e-5) << s.name;
  }
}

// Moments written on every rank (each keeps its block) and read back: every rank's block
// gathered exactly, on every rank, in pieces of at most 1 MiB over the three ranks.
TEST(Zero1, ReadingTheMomentsGathersEveryRanksBlockInPieces) {
  Ranks zero1(true, 1);
  const size_t total = size_t(vit::build_param_table(model()).total), world = 3;
  const size_t block = vit::shard_block(total, 3);
  ASSERT_GT(block * world * sizeof(float), size_t(1) << 20) << "the test needs several pieces";
  std::vector<float> m(total), v(total);
  for (size_t i = 0; i < total; ++i) m[i] = float(i) * 0.5f - 3.0f, v[i] = float(i % 977) + 0.25f;
  std::vector<std::vector<float>> mr(world), vr(world);
  zero1.world.run([&](int r) {
    auto& e = *zero1.engines[size_t(r)];
    e.write_moments(m, v, 0);
    e.read_moments(mr[size_t(r)], vr[size_t(r)]);
  });
  size_t pieces = 0, covered = 0;
  for (const Call& call : zero1.world.calls[0]) {
    if (call.op != "all-gather") continue;
    ++pieces;
    covered += call.block;
    EXPECT_LE(world * call.block * sizeof(float), size_t(1) << 20) << "a piece over 1 MiB";
    EXPECT_EQ(call.block % 64, 0u);
  }
  EXPECT_GE(pieces, 4u) << "two moments, at least two pieces each";
  EXPECT_EQ(covered, 2 * block) << "the pieces cover each moment's block once";
  for (size_t r = 0; r < world; ++r) {
    EXPECT_EQ(mr[r], m) << "rank " << r;
    EXPECT_EQ(vr[r], v) << "rank " << r;
  }
}

}  // namespace
