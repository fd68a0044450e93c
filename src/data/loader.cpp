#include "data/loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "data/source_batch.h"
#include "data/stage_clock.h"

namespace vit::data {

Loader::Loader(const Source& src, Index batch, bool train, uint64_t seed, LoaderOptions opt)
    : src_(src), B_(batch), train_(train), seed_(seed) {
  const Index n = src.size();
  VIT_CHECK(batch > 0, "loader: batch size must be positive");
  VIT_CHECK(opt.shard_count >= 1 && opt.shard_rank >= 0 && opt.shard_rank < opt.shard_count &&
                (train || opt.shard_count == 1),
            "loader: bad shard (training only, 0 <= rank < count)");
  shard_rank_ = opt.shard_rank;
  shard_count_ = opt.shard_count;
  VIT_CHECK(opt.stride >= 1 && (!train || opt.stride == 1), "loader: bad stride (eval only)");
  stride_ = opt.stride;
  const Index global = batch * shard_count_;  // samples of one global batch
  nb_ = opt.batches_per_epoch > 0 ? opt.batches_per_epoch
                                  : (train ? n / global : (n + batch - 1) / batch);
  VIT_CHECK(opt.repeats >= 1, "loader: repeats must be >= 1");
  repeats_ = train ? opt.repeats : 1;
  VIT_CHECK(nb_ * global <= n + (train ? 0 : batch - 1),
            fmt::format("loader: {} batches of {} exceed the {} samples", nb_, global, n));
  const bool threaded = src.memory() == nullptr || opt.force_threads;
  if (!threaded) return;
  int w = opt.workers > 0 ? opt.workers : int(std::max(1u, std::thread::hardware_concurrency()));
  // Enough batches in flight to keep every worker busy, bounded for memory (a 224 px batch of
  // 256 is 150 MiB).
  prefetch_ = opt.prefetch > 0 ? opt.prefetch : std::max(2, std::min(2 * w, 16));
  for (int t = 0; t < w; ++t) threads_.emplace_back([this] { worker_loop(); });
}

Loader::~Loader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

Index Loader::batch_samples(Index k) const {
  return train_ ? B_ : std::min(B_, src_.size() - k * B_);
}

void Loader::indices(uint64_t epoch, Index k, std::vector<Index>& out) {
  const Index b = batch_samples(k);
  out.resize(size_t(b));
  if (!train_) {
    std::iota(out.begin(), out.end(), k * B_);
    return;
  }
  std::shared_ptr<const std::vector<Index>> order;
  {
    std::lock_guard<std::mutex> lock(order_mutex_);
    auto it = orders_.find(epoch);
    if (it == orders_.end()) {
      if (orders_.size() >= 2) orders_.erase(orders_.begin());  // keep this epoch and the next
      it = orders_
               .emplace(epoch, std::make_shared<const std::vector<Index>>(
                                   epoch_order_repeated(src_.size(), seed_, epoch, repeats_)))
               .first;
    }
    order = it->second;
  }
  std::copy_n(order->begin() + (k * shard_count_ + shard_rank_) * B_, b, out.begin());
}

void Loader::build(Job& job) {
  std::vector<Index> idx;
  indices(job.epoch, job.k, idx);
  const Index b = Index(idx.size()), C = src_.channels(), S = job.cfg.img_size;
  job.targets.resize(size_t(b * src_.num_classes()));
  job.labels.resize(size_t(b));
  if (job.planned) {
    make_planned_batch(src_, idx.data(), b, job.cfg, train_, seed_, job.epoch, job.plan,
                       job.targets.data(), job.labels.data());
    return;
  }
  job.images.resize(size_t(b * C * S * S));
  make_source_batch(src_, idx.data(), b, job.cfg, train_, seed_, job.epoch, job.images.data(),
                    job.targets.data(), job.labels.data());
}

void Loader::worker_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    JobPtr job = queue_.front();
    queue_.pop_front();
    job->state = Job::Running;
    lock.unlock();
    try {
      build(*job);
    } catch (...) {
      job->error = std::current_exception();
    }
    lock.lock();
    job->state = Job::Ready;
    if (job->abandoned) jobs_.erase(std::find(jobs_.begin(), jobs_.end(), job));
    done_cv_.notify_all();
  }
}

Loader::JobPtr Loader::find_job(uint64_t epoch, Index k, const BatchConfig& cfg,
                                bool planned) const {
  for (const JobPtr& j : jobs_)
    if (!j->abandoned && j->epoch == epoch && j->k == k && j->cfg == cfg && j->planned == planned)
      return j;
  return nullptr;
}

bool Loader::next_key(uint64_t& epoch, Index& k) const {
  if (k + stride_ < nb_) {
    k += stride_;
    return true;
  }
  if (!train_) return false;  // eval: one pass
  ++epoch;
  k = 0;
  return true;
}

Loader::JobPtr Loader::ready_job(uint64_t epoch, Index k, const BatchConfig& cfg, bool planned) {
  std::unique_lock<std::mutex> lock(mutex_);
  // The window wanted now: this batch and the next prefetch_ ones, all with cfg.
  std::vector<JobPtr> wanted;
  uint64_t e = epoch;
  Index kk = k;
  for (int d = 0; d <= prefetch_; ++d) {
    JobPtr j = find_job(e, kk, cfg, planned);
    if (!j) {
      j = std::make_shared<Job>();
      j->epoch = e;
      j->k = kk;
      j->cfg = cfg;
      j->planned = planned;
      jobs_.push_back(j);
      if (d == 0)
        queue_.push_front(j);  // the batch the caller waits for goes first
      else
        queue_.push_back(j);
    }
    wanted.push_back(j);
    if (!next_key(e, kk)) break;
  }
  // Drop everything else: stale configs, or positions the caller skipped.
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    JobPtr j = *it;
    if (std::find(wanted.begin(), wanted.end(), j) != wanted.end()) {
      ++it;
      continue;
    }
    if (j->state == Job::Running) {
      j->abandoned = true;
      ++it;
      continue;
    }
    if (j->state == Job::Queued) queue_.erase(std::find(queue_.begin(), queue_.end(), j));
    it = jobs_.erase(it);
  }
  JobPtr job = wanted.front();
  work_cv_.notify_all();
  done_cv_.wait(lock, [&] { return job->state == Job::Ready; });
  jobs_.erase(std::find(jobs_.begin(), jobs_.end(), job));
  return job;
}

void Loader::check_request(Index k, const BatchConfig& cfg) const {
  VIT_CHECK(k >= 0 && k < nb_, fmt::format("loader: batch {} outside 0..{}", k, nb_ - 1));
  VIT_CHECK(int(cfg.mean.size()) == src_.channels() && int(cfg.std.size()) == src_.channels(),
            "loader: mean/std need one value per channel");
}

void Loader::load(uint64_t epoch, Index k, const BatchConfig& cfg, float* images, float* targets,
                  int32_t* labels) {
  check_request(k, cfg);
  if (threads_.empty()) {
    std::vector<Index> idx;
    indices(epoch, k, idx);
    make_source_batch(src_, idx.data(), Index(idx.size()), cfg, train_, seed_, epoch, images,
                      targets, labels);
    return;
  }
  const JobPtr job = ready_job(epoch, k, cfg, false);
  if (job->error) std::rethrow_exception(job->error);
  StageScope clock(Stage::Copy);
  std::memcpy(images, job->images.data(), job->images.size() * sizeof(float));
  std::memcpy(targets, job->targets.data(), job->targets.size() * sizeof(float));
  if (labels) std::memcpy(labels, job->labels.data(), job->labels.size() * sizeof(int32_t));
}

void Loader::load_planned(uint64_t epoch, Index k, const BatchConfig& cfg, PlannedBatch& plan,
                          float* targets, int32_t* labels) {
  check_request(k, cfg);  // (make_planned_batch refuses what is not plannable)
  JobPtr job;
  if (threads_.empty()) {
    job = std::make_shared<Job>();
    job->epoch = epoch;
    job->k = k;
    job->cfg = cfg;
    job->planned = true;
    build(*job);
  } else {
    job = ready_job(epoch, k, cfg, true);
    if (job->error) std::rethrow_exception(job->error);
  }
  StageScope clock(Stage::Copy);
  std::swap(plan, job->plan);  // the job is done with: take its buffers instead of copying
  std::memcpy(targets, job->targets.data(), job->targets.size() * sizeof(float));
  if (labels) std::memcpy(labels, job->labels.data(), job->labels.size() * sizeof(int32_t));
}

}  // namespace vit::data
