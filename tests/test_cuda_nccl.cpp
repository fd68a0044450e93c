// The NCCL communicator (src/dist/comm_nccl.cpp) at world size one, on one GPU: the same code
// path as a multi-GPU job (bootstrap, collectives on device and host buffers, the engine's
// gradient all-reduce and loss mean, ZeRO-1's reduce-scatter / norm / all-gather), whose sums
// over one rank change nothing, so the engine must train bitwise as without a communicator. Label
// `gpu`; skips without a device (fails under VIT_REQUIRE_GPU=1) and in builds without NCCL.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "dist/comm_nccl.h"
#include "engine_test_util.h"
#include "gpu_test_util.h"
#include "train/engine.h"
#include "train/engine_cuda.h"

namespace {

using vit::Index;

class NcclWorldOfOne : public ::testing::Test {
 protected:
  void SetUp() override {
    vit::register_cuda_backend();
    VIT_GPU_TEST_PRECONDITION();
#ifndef VIT_HAS_NCCL
    GTEST_SKIP() << "built without NCCL";
#endif
  }
};

#ifdef VIT_HAS_NCCL
std::shared_ptr<vit::Comm> world_of_one() {
  vit::LaunchEnv env;  // rank 0 of 1: no meeting point needed
  return vit::make_nccl_comm(env, nullptr, 60.0);
}
#endif

TEST_F(NcclWorldOfOne, CollectivesOnDeviceAndHostBuffers) {
#ifdef VIT_HAS_NCCL
  auto comm = world_of_one();
  EXPECT_EQ(comm->name(), "nccl");
  EXPECT_EQ(comm->size(), 1);
  const std::vector<float> host = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};  // (5)
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  comm->allreduce_sum(dev, host.size());  // device buffer, ordered on the op stream
  std::vector<float> back(host.size());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);
  comm->allreduce_sum_start(dev, 2);  // non-blocking: two ranges, then the op stream waits
  comm->allreduce_sum_start(dev + 2, host.size() - 2);
  comm->progress();
  comm->wait_all();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, host.size() * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(dev);
  EXPECT_EQ(back, host);
  double sums[3] = {1.0, 2.5, -4.0};  // host buffer: staged through the device
  comm->allreduce_mean(sums, 3);
  EXPECT_EQ(sums[0], 1.0);
  EXPECT_EQ(sums[1], 2.5);
  EXPECT_EQ(sums[2], -4.0);
  EXPECT_EQ(vit::broadcast_string(*comm, "runs/exp1", 0), "runs/exp1");
#endif
}

// Host buffers go through pinned memory and device scratch; one over 1 MiB (ZeRO-1's moment
// gather) frees that scratch afterwards, and the next, smaller one allocates it again. The
// device memory in use comes back to where it was.
TEST_F(NcclWorldOfOne, LargeHostCollectiveLeavesNoScratchBehind) {
#ifdef VIT_HAS_NCCL
  auto comm = world_of_one();
  double small[2] = {0.5, -1.0};
  comm->allreduce_sum(small, 2);  // the kept scratch exists from here on
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  std::vector<float> big(size_t(16) << 20);  // (16 Mi) 64 MiB
  for (size_t i = 0; i < big.size(); ++i) big[i] = float(i % 1000) * 0.25f;
  const std::vector<float> want = big;
  comm->allgather(big.data(), big.size());  // one block: the world of one
  EXPECT_EQ(big, want);
  comm->allreduce_sum(small, 2);
  EXPECT_EQ(small[0], 0.5);
  EXPECT_EQ(small[1], -1.0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_GE(free1 + (size_t(8) << 20), free0) << "the 64 MiB scratch of the gather was kept";
#endif
}

TEST_F(NcclWorldOfOne, EngineTrainsBitwiseAsWithoutCommunicator) {
#ifdef VIT_HAS_NCCL
  const vit::ModelConfig c = vit::test::config_of(vit::test::kComparisonCases[1]);
  const Index B = 5;
  vit::EngineOptions o = vit::test::engine_options("cuda", "bf16", c, B);
  auto plain = vit::make_engine(o);
  o.comm = world_of_one();
  auto dp = vit::make_engine(o);
  std::vector<float> p0(size_t(plain->table().total), 0.0f);
  vit::init_params(p0.data(), plain->table(), c, 3);
  o.micro_batches = 2;  // train_three_steps' updates: the sums overlap the second's backward
  auto overlapped = vit::make_engine(o);
  const auto a = vit::test::train_three_steps(*plain, p0, c, B);
  const auto b = vit::test::train_three_steps(*dp, p0, c, B);
  const auto d = vit::test::train_three_steps(*overlapped, p0, c, B);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)), 0)
      << "an all-reduce over one rank must not change the update";
  EXPECT_EQ(a.losses, d.losses);
  EXPECT_EQ(std::memcmp(a.params.data(), d.params.data(), a.params.size() * sizeof(float)), 0)
      << "all-reduces overlapped with the backward pass must not change the update";
#endif
}

// ZeRO-1 over a NCCL world of one: one block holding everything, so the same update as the
// fused step (the norm's partial sums and their order are the same, the root taken after the
// all-reduce), and the bf16 copy converted after the all-gather: bitwise the plain engine.
TEST_F(NcclWorldOfOne, ShardedOptimizerTrainsBitwiseAsThePlainEngine) {
#ifdef VIT_HAS_NCCL
  const vit::ModelConfig c = vit::test::config_of(vit::test::kComparisonCases[0]);
  const Index B = 5;
  vit::EngineOptions o = vit::test::engine_options("cuda", "bf16", c, B);
  auto plain = vit::make_engine(o);
  o.comm = world_of_one();
  o.shard_optimizer = true;
  auto zero1 = vit::make_engine(o);
  std::vector<float> p0(size_t(plain->table().total), 0.0f);
  vit::init_params(p0.data(), plain->table(), c, 4);
  const auto a = vit::test::train_three_steps(*plain, p0, c, B);
  const auto b = vit::test::train_three_steps(*zero1, p0, c, B);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(std::memcmp(a.params.data(), b.params.data(), a.params.size() * sizeof(float)), 0);
  std::vector<float> ma, va, mb, vb;
  plain->read_moments(ma, va);
  zero1->read_moments(mb, vb);  // gathered from the blocks (one here)
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(va, vb);
#endif
}

}  // namespace
