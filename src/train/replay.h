// EfficientTrain++ replay buffer (methods.md §2.3, "weak CPU / limited data loading"): each fresh
// loader batch is split into split_factor chunks appended to a FIFO; the training batch is the
// fresh batch plus (replay_times - 1) * split_factor chunks drawn uniformly, with replacement,
// from the FIFO (which already holds the fresh batch's own chunks). When the FIFO holds more than
// capacity_batches * split_factor chunks, the oldest split_factor chunks are dropped.
// DeiT-S: replay_times [4,4,2,2,2,2,1,1,1,1], capacity [1920,1920,256,256,256,256,0,...] per
// stage, split 32; at replay 4 a fresh batch of 128 gives 128 + 96 chunks * 4 = 512 samples.
// Images change size between stages: use one ReplayBuffer per stage.
//
// Shapes: images (B, C, S, S) row-major, passed as B rows of img_elems = C*S*S floats;
// targets (B, K) soft targets (apply Mixup/CutMix after assemble(), as ET++ does).
// Not thread-safe (one instance per training loop).
#pragma once
#include <cstdint>
#include <deque>
#include <vector>

#include "core/rng.h"

namespace vit {

// Sample storage inside the buffer. F16 halves memory, like ET++'s ToHalf transform; then both the
// fresh and the replayed images come out rounded through fp16 (round to nearest even), so all
// samples of a training batch see the same precision. Targets are always kept as float.
enum class ReplayStorage { F32, F16 };

class ReplayBuffer {
 public:
  // replay_times >= 1 (1: no replay, assemble() returns the fresh batch only and nothing is
  // buffered); split_factor >= 1; capacity_batches >= 1 when replay_times > 1 (ignored when 1).
  // The draws come from Rng(seed). Throws vit::Error on bad arguments.
  ReplayBuffer(int replay_times, int split_factor, int capacity_batches, uint64_t seed,
               ReplayStorage storage = ReplayStorage::F32);

  // Sets the fresh batch for the next assemble() and appends it to the FIFO as
  // min(split_factor, B) chunks of consecutive samples (sizes differ by at most one, larger first),
  // then drops the oldest split_factor chunks while the FIFO exceeds capacity.
  // images: (B, C, S, S) = B * img_elems floats; targets: (B, K). img_elems and K must stay the
  // same for the life of the buffer. Throws vit::Error on bad sizes or on two pushes without an
  // assemble() in between.
  void push(const float* images, const float* targets, int B, int img_elems, int K);

  // Largest sample count the next assemble() can write: B + (replay_times-1) * split_factor *
  // (largest chunk in the FIFO). Equals B * replay_times when B is a multiple of split_factor.
  int max_assemble_samples() const;

  // Writes the pending fresh batch followed by (replay_times - 1) * split_factor randomly drawn
  // chunks: images_out (n, C, S, S), targets_out (n, K), where n is returned (n <=
  // max_assemble_samples()). capacity_samples is the room (in samples) of both outputs; throws
  // vit::Error if it is too small or if no push() is pending. Consumes the fresh batch.
  int assemble(float* images_out, float* targets_out, int capacity_samples);

  int replay_times() const { return replay_times_; }
  int split_factor() const { return split_factor_; }
  int capacity_batches() const { return capacity_batches_; }
  int chunks() const { return int(fifo_.size()); }  // chunks in the FIFO
  int64_t buffered_samples() const;                 // samples in the FIFO
  int img_elems() const { return img_elems_; }
  int classes() const { return K_; }
  bool pending() const { return fresh_n_ > 0; }

 private:
  struct Chunk {
    int n = 0;
    std::vector<float> img;      // n * img_elems (F32 storage)
    std::vector<uint16_t> half;  // n * img_elems (F16 storage)
    std::vector<float> tgt;      // n * K
  };
  void store(Chunk& c, const float* images, const float* targets, int n) const;
  void load(const Chunk& c, float* images_out, float* targets_out) const;

  int replay_times_, split_factor_, capacity_batches_;
  ReplayStorage storage_;
  Rng rng_;
  int img_elems_ = 0, K_ = 0;
  Chunk fresh_;
  int fresh_n_ = 0;
  std::deque<Chunk> fifo_;
};

// IEEE fp16 conversions used by ReplayStorage::F16 (round to nearest even; inf/NaN kept).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);

}  // namespace vit
