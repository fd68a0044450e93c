// The precondition of every GPU test (test_cuda_*.cpp). Without a usable CUDA device the test
// SKIPS with "no CUDA device: <reason>", which keeps the suite green on machines without a GPU.
// With VIT_REQUIRE_GPU=1 in the environment it FAILS instead: on the GPU machine a driver older
// than the runtime, a busy device or a broken install must not pass as "all skipped".
//
//   void SetUp() override { VIT_GPU_TEST_PRECONDITION(); }   // or first thing in a TEST body
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "ops/cuda/ops.h"

namespace vit::test {

struct GpuStatus {
  bool usable = false;
  std::string why;  // the reason when not usable
};

// Probed once per process: a device must be counted and a context must start on it (the first
// runtime call that needs one, cudaFree(nullptr), is where a busy or prohibited device or a
// missing kernel-mode driver shows up).
inline const GpuStatus& gpu_status() {
  static const GpuStatus status = [] {
    GpuStatus s;
    if (vit::cuda::device_count(&s.why) == 0) return s;
    const cudaError_t err = cudaFree(nullptr);
    if (err != cudaSuccess) {
      cudaGetLastError();  // clear it for the tests that still run (none use the device)
      s.why = std::string("cannot create a context: ") + cudaGetErrorString(err);
      return s;
    }
    s.usable = true;
    return s;
  }();
  return status;
}

// VIT_REQUIRE_GPU set to anything but "" or "0".
inline bool gpu_required() {
  const char* e = std::getenv("VIT_REQUIRE_GPU");
  return e && *e && std::strcmp(e, "0") != 0;
}

}  // namespace vit::test

// Skips (or, with VIT_REQUIRE_GPU=1, fails) the current test and returns from the enclosing
// void function when no CUDA device is usable. In SetUp() either outcome keeps the body from
// running.
#define VIT_GPU_TEST_PRECONDITION()                                                        \
  do {                                                                                     \
    const ::vit::test::GpuStatus& vit_gpu_ = ::vit::test::gpu_status();                    \
    if (!vit_gpu_.usable) {                                                                \
      if (::vit::test::gpu_required()) {                                                   \
        GTEST_FAIL() << "no CUDA device: " << vit_gpu_.why << " (VIT_REQUIRE_GPU is set)"; \
      } else {                                                                             \
        GTEST_SKIP() << "no CUDA device: " << vit_gpu_.why;                                \
      }                                                                                    \
    }                                                                                      \
  } while (0)
