// The data loader: batch k of epoch e, built with a BatchConfig, by worker threads that keep a
// bounded queue of the next batches ready.
//
// * Train (shuffled): batch k of epoch e holds epoch_order(n, seed, e)[k*B, (k+1)*B); eval
//   (sequential): samples [k*B, min(n, (k+1)*B)), the last batch may be short.
// * Every sample's randomness comes from (seed, epoch, sample index), so a batch is bitwise the
//   same whatever the number of workers, and whether it was prefetched or built on demand.
// * A prefetched batch is keyed by (epoch, k, config): the caller may change the config at any
//   time (image-size curriculum, EfficientTrain++ magnitude); a batch built with another config
//   is dropped and rebuilt.
// * In-memory sources are built synchronously in the caller's thread (make_batch's OpenMP loop
//   shares the cores with compute, and the batches stay bitwise those of the fixed-size path).
//   Streamed sources (ImageFolder, packed) use `workers` threads.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/batch.h"
#include "data/planned_batch.h"
#include "data/source.h"

namespace vit::data {

struct LoaderOptions {
  int workers = 0;              // batch-building threads for streamed sources (0 = all cores)
  int prefetch = 0;             // batches built ahead of the one asked for (0 = 2 x workers,
                                // at most 16)
  Index batches_per_epoch = 0;  // 0 = n / B (train, drop last) or ceil(n / B) (eval)
  bool force_threads = false;   // testing: use worker threads for in-memory sources too
  int repeats = 1;              // train: repeated augmentation (epoch_order_repeated)
  // Train, data parallel: this rank's share of each global batch of shard_count * B samples.
  // Batch k holds epoch_order[(k * shard_count + shard_rank) * B, + B), so the ranks together
  // see exactly the one-rank order with the global batch.
  int shard_rank = 0, shard_count = 1;
  // Eval, data parallel: the caller asks for batches k, k + stride, ..., so prefetch those.
  int stride = 1;
};

class Loader {
 public:
  Loader(const Source& src, Index batch, bool train, uint64_t seed, LoaderOptions opt = {});
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  Index batches_per_epoch() const { return nb_; }
  Index batch_samples(Index k) const;  // samples in batch k (B, or fewer for eval's last one)
  int workers() const { return int(threads_.size()); }  // 0 = synchronous

  // Writes batch k of `epoch` built with cfg: images (b, C, S, S), targets (b, K), labels (b)
  // (may be null), b = batch_samples(k). Blocks until it is ready, then queues the batches
  // that follow (with the same cfg). Throws the vit::Error a worker hit.
  void load(uint64_t epoch, Index k, const BatchConfig& cfg, float* images, float* targets,
            int32_t* labels = nullptr);
  // The same batch left as a plan for the device's pixel work (data/planned_batch.h): `plan`
  // receives the crops and tables, targets and labels as load's. Throws vit::Error when the
  // source and cfg are not plannable. Planned and float batches are prefetched separately.
  void load_planned(uint64_t epoch, Index k, const BatchConfig& cfg, PlannedBatch& plan,
                    float* targets, int32_t* labels = nullptr);

 private:
  struct Job {
    uint64_t epoch = 0;
    Index k = 0;
    BatchConfig cfg;
    bool planned = false;  // build a PlannedBatch instead of float images
    enum { Queued, Running, Ready } state = Queued;
    bool abandoned = false;  // no longer wanted; the worker drops it when done
    std::vector<float> images, targets;
    std::vector<int32_t> labels;
    PlannedBatch plan;
    std::exception_ptr error;
  };
  using JobPtr = std::shared_ptr<Job>;

  // k names a batch of the epoch, cfg has one mean/std per channel (throws vit::Error).
  void check_request(Index k, const BatchConfig& cfg) const;
  // The sample indices of batch k of epoch e (b of them).
  void indices(uint64_t epoch, Index k, std::vector<Index>& out);
  void build(Job& job);
  void worker_loop();
  JobPtr find_job(uint64_t epoch, Index k, const BatchConfig& cfg,
                  bool planned) const;  // under mutex_
  // Batch k of epoch built (by the workers, queueing the batches after it), or its error.
  JobPtr ready_job(uint64_t epoch, Index k, const BatchConfig& cfg, bool planned);
  bool next_key(uint64_t& epoch, Index& k) const;

  const Source& src_;
  const Index B_;
  const bool train_;
  const uint64_t seed_;
  int repeats_ = 1;
  int shard_rank_ = 0, shard_count_ = 1, stride_ = 1;
  Index nb_ = 0;
  int prefetch_ = 0;

  std::mutex mutex_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<JobPtr> queue_;  // Queued jobs, the one asked for first
  std::vector<JobPtr> jobs_;  // every job not yet handed out
  bool stop_ = false;
  std::vector<std::thread> threads_;

  std::mutex order_mutex_;
  std::map<uint64_t, std::shared_ptr<const std::vector<Index>>> orders_;  // epoch -> order
};

}  // namespace vit::data
