// The op profile's device timer (core/profile.h): a pair of CUDA events around each op on the
// op stream, read back when the table is printed, so op times are device times (the host clock
// would time only the asynchronous launches). Events come from a pool that grows to the ops
// of the profiled steps and is reused after each collect; recording them does not sync.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/profile.h"
#include "ops/cuda/common.cuh"
#include "ops/cuda/device.h"

namespace vit::cuda {

namespace {

class EventTimer : public ProfileTimer {
 public:
  ~EventTimer() override {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);  // best effort at exit
  }
  int begin() override {
    const int token = int(starts_.size());
    starts_.push_back(next_event());
    VIT_CUDA_CHECK(cudaEventRecord(starts_.back(), stream()));
    return token;
  }
  void end(int token, const char* name, const OpWork& work) override {
    cudaEvent_t stop = next_event();
    VIT_CUDA_CHECK(cudaEventRecord(stop, stream()));
    pending_.push_back({token, stop, name, work});
  }
  void collect(std::map<std::string, OpTotals>& totals) override {
    if (!pending_.empty()) VIT_CUDA_CHECK(cudaEventSynchronize(pending_.back().stop));
    for (const Interval& iv : pending_) {
      float ms = 0.0f;
      VIT_CUDA_CHECK(cudaEventElapsedTime(&ms, starts_[size_t(iv.token)], iv.stop));
      OpTotals& t = totals[iv.name];
      t.seconds += 1e-3 * double(ms);
      t.flops += iv.work.flops;
      t.bytes += iv.work.bytes;
      ++t.calls;
    }
    pending_.clear();
    starts_.clear();
    used_ = 0;  // every event is free again
  }

 private:
  struct Interval {
    int token;
    cudaEvent_t stop;
    std::string name;
    OpWork work;
  };
  cudaEvent_t next_event() {
    if (used_ == pool_.size()) {
      cudaEvent_t e;
      VIT_CUDA_CHECK(cudaEventCreate(&e));
      pool_.push_back(e);
    }
    return pool_[used_++];
  }
  std::vector<cudaEvent_t> pool_;
  size_t used_ = 0;
  std::vector<cudaEvent_t> starts_;  // by token
  std::vector<Interval> pending_;
};

}  // namespace

void install_profile_timer() {
  static EventTimer timer;
  Profile::set_timer(&timer);
}

}  // namespace vit::cuda
