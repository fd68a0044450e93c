#include "train/train_batches.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "core/rng.h"
#include "data/lowfreq.h"
#include "data/source.h"
#include "train/batch_config.h"

namespace vit {

TrainBatches::TrainBatches(const TrainArgs& args, const RunPlan& plan, const data::DataSplits& data,
                           int img_size, int64_t step, int rank, int world)
    : args_(args),
      plan_(plan),
      rank_(rank),
      B_(plan.batch / world),
      cap_(plan.max_samples / world),
      C_(plan.final_cfg.in_chans),
      K_(plan.final_cfg.num_classes),
      Kd_(data.train->num_classes()),
      size_(img_size),
      // In-memory data keeps the pad-crop/flip path unless a timm flag is given; streamed data
      // (photos of any size) defaults to timm's RandomResizedCrop + flip.
      train_bc_(train_batch_config(args, img_size, data.mean, data.std, data.streamed())),
      et_bc_(train_bc_),
      mix_(mixup_config(args)),
      // Batch u of an epoch holds micro-batches u*accum .. u*accum+accum-1 of the loader.
      loader_(*data.train, B_, true, uint64_t(args.seed),
              {args.workers, 0, plan.updates_per_epoch * plan.accum, false, args.aug_repeats, rank,
               world}) {
  et_bc_.img_size = plan.final_size;
  if (args.augment_on_device) {
    check_plannable(*data.train);
    planned_ = true;
    lut_ = data::normalize_lut(train_bc_, C_);
  }
  const Index F = plan.final_size;
  if (plan.efficienttrain) full_images_.resize(B_ * C_ * F * F);
  set_size(img_size, step);
}

void TrainBatches::set_size(int size, int64_t step) {
  size_ = size;
  train_bc_.img_size = size;
  images_.assign(cap_ * C_ * size * size, 0.0f);
  targets_.assign(cap_ * K_, 0.0f);
  make_replay(step);
}

void TrainBatches::set_magnitude(double m) {
  train_bc_.magnitude_override = m;
  et_bc_.magnitude_override = m;
}

void TrainBatches::make_replay(int64_t step) {
  if (plan_.replay <= 1) return;
  const Index B = B_;
  // ET++ splits a batch into 32 chunks; here into the largest count up to 32 that divides B, so
  // every chunk has B / split samples and a training batch always holds B * replay of them:
  // unequal chunks made the count vary with the draws, past the batch's room (and, data
  // parallel, differ between ranks, whose losses are scaled by one count).
  Index split = std::min<Index>(32, B);
  while (B % split != 0) --split;
  // Data parallel: each rank replays its own share of the batches, with draws of its own.
  replay_ = std::make_unique<ReplayBuffer>(plan_.replay, int(split), 4,
                                           mix_seed(args_.seed, uint64_t(step), 77 + rank_));
  fresh_images_.assign(B * C_ * size_ * size_, 0.0f);
  fresh_targets_.assign(B * K_, 0.0f);
}

void TrainBatches::load_fresh(int64_t epoch, Index mb, float* images, float* targets) {
  const Index B = B_, S = size_, F = plan_.final_size;
  if (plan_.efficienttrain && S != F) {
    // ET++: the batch at the final size, then its low-frequency part at S (methods.md §2.3).
    loader_.load(uint64_t(epoch), mb, et_bc_, full_images_.data(), targets);
    const Index in_elems = C_ * F * F, out_elems = C_ * S * S;
    const bool fft = args_.lowfreq == "fft";
#pragma omp parallel for schedule(static)
    for (Index i = 0; i < B; ++i) {
      const float* src = full_images_.data() + i * in_elems;
      if (fft)
        fft_lowfreq_crop(src, int(C_), int(F), images + i * out_elems, int(S));
      else
        antialias_downsample(src, int(C_), int(F), images + i * out_elems, int(S));
    }
  } else {
    loader_.load(uint64_t(epoch), mb, plan_.efficienttrain ? et_bc_ : train_bc_, images, targets);
  }
  data::widen_targets(targets, B, Kd_, K_);
  if (mix_.mixup_alpha > 0 || mix_.cutmix_alpha > 0)
    data::apply_mixup(mix_, images, targets, B, C_, S, K_, uint64_t(args_.seed), uint64_t(epoch),
                      uint64_t(mb));
}

void TrainBatches::check_plannable(const data::Source& train) const {
  const char* why = nullptr;
  if (plan_.replay > 1)
    why = "the replay buffer keeps float images on the CPU";
  else if (!data::plannable(train, plan_.efficienttrain ? et_bc_ : train_bc_, true))
    why = "an in-memory set's pad-and-crop path runs on the CPU (in-memory sets need --scale)";
  VIT_CHECK(!why, fmt::format("--augment-on-device: {}; drop the flag or that option", why));
}

Index TrainBatches::load_planned(int64_t epoch, Index mb, double* data_seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  // ET++ as load_fresh: the plan at the final size, its low-frequency pass where it is made.
  const bool et = plan_.efficienttrain;
  loader_.load_planned(uint64_t(epoch), mb, et ? et_bc_ : train_bc_, plan_batch_, targets_.data());
  if (et && size_ != plan_.final_size) {
    plan_batch_.lowfreq.kind =
        args_.lowfreq == "fft" ? LowFreqKind::kFft : LowFreqKind::kDownsample;
    plan_batch_.lowfreq.side = size_;
  }
  data::widen_targets(targets_.data(), B_, Kd_, K_);
  // load_fresh's mixup: the same draws; the targets mix here, the images where they are made.
  if (mix_.mixup_alpha > 0 || mix_.cutmix_alpha > 0) {
    const data::MixupResult r =
        data::draw_mixup(mix_, B_, size_, uint64_t(args_.seed), uint64_t(epoch), uint64_t(mb));
    data::mix_targets(r, targets_.data(), B_, K_);
    plan_batch_.mix = r.batch_mix();
  }
  *data_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return B_;
}

Index TrainBatches::load(int64_t epoch, Index mb, double* data_seconds) {
  const bool replaying = plan_.replay > 1;
  float* fresh = replaying ? fresh_images_.data() : images_.data();
  float* fresh_t = replaying ? fresh_targets_.data() : targets_.data();
  const auto t0 = std::chrono::steady_clock::now();
  load_fresh(epoch, mb, fresh, fresh_t);
  *data_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!replaying) return B_;
  replay_->push(fresh, fresh_t, int(B_), int(C_ * size_ * size_), int(K_));
  return replay_->assemble(images_.data(), targets_.data(), int(cap_));
}

}  // namespace vit
