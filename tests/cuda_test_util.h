// Shared by the CUDA op tests (test_cuda_ops.cpp, test_cuda_flash_attention.cpp): guarded
// device buffers, bf16-rounded random inputs, the tolerance check and the fixture that
// skips without a device. test_cuda_ops.cpp's header comment says what the guards and tolerances
// mean.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "bf16_ulps.h"
#include "core/common.h"
#include "core/rng.h"
#include "gpu_test_util.h"
#include "ops/cuda/ops.h"
#include "ops/kernel_plan.h"

namespace vit::test {

using Vec = std::vector<float>;

inline void cuda_ok(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

inline float to_float(float x) {
  return x;
}
inline float to_float(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <typename E>
E from_float(float x) {
  if constexpr (std::is_same_v<E, float>)
    return x;
  else
    return __float2bfloat16_rn(x);
}

// ---------------------------------------------------------------------------------------------
// Device buffers with guard bytes

constexpr size_t kGuard = 256;            // bytes each side (keeps the data 256-byte aligned)
constexpr unsigned char kPattern = 0x7f;  // guards and initial contents

template <typename E>
class DevBuf {
 public:
  // n elements, `offset` elements into the allocation: offset 1 gives the 2- or 4-byte
  // aligned pointers of a tensor inside the flat parameter buffer.
  explicit DevBuf(size_t n, std::string name, size_t offset = 0)
      : n_(n), off_(offset), name_(std::move(name)) {
    cuda_ok(cudaMalloc(&base_, bytes()), "cudaMalloc");
    cuda_ok(cudaMemset(base_, kPattern, bytes()), "cudaMemset");
  }
  DevBuf(const Vec& host, std::string name, size_t offset = 0)
      : DevBuf(host.size(), std::move(name), offset) {
    upload(host);
  }
  ~DevBuf() {
    check_guards();
    cudaFree(base_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;

  E* get() {
    return reinterpret_cast<E*>(static_cast<unsigned char*>(base_) + kGuard + off_ * sizeof(E));
  }
  void upload(const Vec& host) {
    std::vector<E> tmp(host.size());
    for (size_t i = 0; i < host.size(); ++i) tmp[i] = from_float<E>(host[i]);
    cuda_ok(cudaMemcpy(get(), tmp.data(), n_ * sizeof(E), cudaMemcpyHostToDevice), "upload");
  }
  Vec download() const {
    std::vector<E> tmp(n_);
    cuda_ok(cudaMemcpy(tmp.data(), const_cast<DevBuf*>(this)->get(), n_ * sizeof(E),
                       cudaMemcpyDeviceToHost),
            "download");
    Vec out(n_);
    for (size_t i = 0; i < n_; ++i) out[i] = to_float(tmp[i]);
    return out;
  }
  // The guard bytes on both sides must be untouched (an out-of-bounds write lands there).
  void check_guards() {
    std::vector<unsigned char> head(kGuard), tail(kGuard);
    auto* b = static_cast<unsigned char*>(base_);
    if (cudaMemcpy(head.data(), b, kGuard, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(tail.data(), b + kGuard + (off_ + n_) * sizeof(E), kGuard,
                   cudaMemcpyDeviceToHost) != cudaSuccess) {
      ADD_FAILURE() << name_ << ": cannot read guard bytes";
      return;
    }
    size_t bad_head = 0, bad_tail = 0;
    for (size_t i = 0; i < kGuard; ++i) {
      bad_head += head[i] != kPattern;
      bad_tail += tail[i] != kPattern;
    }
    EXPECT_EQ(bad_head, 0u) << name_ << ": write before the buffer (guard bytes changed)";
    EXPECT_EQ(bad_tail, 0u) << name_ << ": write past the buffer (guard bytes changed)";
  }

 private:
  size_t bytes() const { return (off_ + n_) * sizeof(E) + 2 * kGuard; }
  void* base_ = nullptr;
  size_t n_, off_;
  std::string name_;
};

// ---------------------------------------------------------------------------------------------
// Inputs and comparison

// Normal(shift, scale) values, rounded to the storage type E so both sides see the same inputs.
template <typename E>
Vec rnd(Index n, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  vit::Rng rng(seed);
  Vec v(n);
  for (auto& x : v) x = to_float(from_float<E>(float(shift + scale * rng.normal())));
  return v;
}

struct Tol {
  double rtol, atol;  // |gpu - ref| <= rtol * |ref| + atol * max|ref|
};
// Per-op tolerance: the first for fp32 storage, the second for bf16.
template <typename T>
Tol pick(Tol f32, Tol b16) {
  return std::is_same_v<T, float> ? f32 : b16;
}

// A kernel plan with these options (a --kernels string) active for a scope: the ops' choices
// (ops/kernel_plan.h), as an engine holds its plan around its passes.
struct ScopedKernels {
  vit::KernelPlan plan;
  vit::ActivePlanScope scope;
  explicit ScopedKernels(const char* options)
      : plan(vit::DeviceProps{}, vit::parse_kernel_options(options)), scope(&plan) {}
};

inline double max_abs(const Vec& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// |gpu - ref| <= rtol * |ref| + atol * scale. expect_close takes scale = max|ref|; a caller whose
// reference can be all zeros where the op's true values are not (an fp32 GELU of x < -5.5 is -0
// by cancellation in 1 + erf) passes the inputs' scale instead.
inline void expect_close_scaled(const std::string& what, const Vec& got, const Vec& ref, Tol tol,
                                double scale) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t nonfinite = 0, bad = 0, worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++nonfinite;
      continue;
    }
    const double err = std::fabs(double(got[i]) - double(ref[i]));
    const double lim = tol.rtol * std::fabs(double(ref[i])) + tol.atol * scale + 1e-30;
    if (err > lim) ++bad;
    if (err / lim > worst_ratio) {
      worst_ratio = err / lim;
      worst = i;
    }
  }
  EXPECT_EQ(nonfinite, 0u) << what << ": NaN/Inf in the GPU output";
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " elements beyond tolerance (rtol " << tol.rtol << ", atol " << tol.atol
                     << " x scale " << scale << "); worst [" << worst << "] gpu " << got[worst]
                     << " ref " << ref[worst] << " (" << worst_ratio << " x the limit)";
}

inline void expect_close(const std::string& what, const Vec& got, const Vec& ref, Tol tol) {
  expect_close_scaled(what, got, ref, tol, max_abs(ref));
}

// Bit for bit (a tolerance of zero would still pass -0 for +0 and differences below 1e-30).
inline void expect_same_bits(const std::string& what, const Vec& got, const Vec& ref) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], sizeof(float)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size()
                        << " elements differ in their bits; first [" << first << "] " << got[first]
                        << " vs " << ref[first];
}

// ---------------------------------------------------------------------------------------------
// Fixtures: skip without a device (fail with VIT_REQUIRE_GPU=1)

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override { VIT_GPU_TEST_PRECONDITION(); }
  void TearDown() override {
    // Surfaces asynchronous kernel errors (not when SetUp found no device to ask).
    if (!IsSkipped() && vit::test::gpu_status().usable) vit::cuda::synchronize();
  }
};

using StorageTypes = ::testing::Types<float, __nv_bfloat16>;
class TypeNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, float> ? "fp32" : "bf16";
  }
};

}  // namespace vit::test
