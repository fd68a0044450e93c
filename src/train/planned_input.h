// Planned batches (data/planned_batch.h) into an engine's input: on the host the reference
// ops expand the plan into float images; on the GPU the plan's crops and tables travel through
// the engine's pinned input slot and the batched input ops make the images on the device, so
// the CPU never resizes and the copy carries uint8 crops instead of float images. A plan with a
// low-frequency pass (EfficientTrain++) is made at the final side and mapped to the model's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/erase_plan.h"
#include "core/lowfreq_operator.h"
#include "core/resize_plan.h"
#include "data/planned_batch.h"
#include "ops/cpu/lowfreq_batch.h"
#include "ops/cpu/pixel_steps.h"
#include "ops/cpu/resize_batch.h"

namespace vit {

// images (B, C, S', S') from the plan with the CPU reference ops, S' = plan.out_side().
inline void expand_on_host(const data::PlannedBatch& plan, const std::vector<float>& lut,
                           float* images) {
  const Index B = plan.size(), C = plan.C, S = plan.S;
  std::vector<uint8_t> rows(size_t(plan.scratch_bytes));  // each sample's (C, bh, S)
  std::vector<uint8_t> u8(size_t(B * C * S * S));         // (B, C, S, S)
  cpu::resize_rows(plan.pixels.data(), plan.tables.data(), plan.samples.data(), B, C, S,
                   rows.data());
  cpu::resize_cols(rows.data(), plan.tables.data(), plan.samples.data(), B, C, S, u8.data());
  cpu::apply_pixel_steps(u8.data(), plan.steps.data(), plan.step_slots, B, C, S, plan.fill);
  if (!plan.lowfreq.active()) {
    cpu::normalize_u8(u8.data(), lut.data(), erase_noise_table().data(), plan.samples.data(),
                      plan.mix, B, C, S, images);
    return;
  }
  // EfficientTrain++: normalised (and erased) at S, the low-frequency pass to S', then mixed.
  const Index Sl = plan.lowfreq.side;
  const bool complex = plan.lowfreq.kind == LowFreqKind::kFft;
  std::vector<float> full(size_t(B * C * S * S));  // (B, C, S, S)
  std::vector<float> scratch(cpu::lowfreq_scratch_floats(B * C, S, Sl, complex));
  std::vector<float> low(size_t(B * C * Sl * Sl));  // (B, C, S', S')
  cpu::normalize_u8(u8.data(), lut.data(), erase_noise_table().data(), plan.samples.data(),
                    BatchMix{}, B, C, S, full.data());
  cpu::lowfreq_batch(full.data(), lowfreq_operator(plan.lowfreq.kind, S, Sl).data(), complex, B * C,
                     S, Sl, scratch.data(), low.data());
  cpu::mix_images(low.data(), plan.mix, B, C, Sl, images);
}

// The device side, per engine: per input slot the plan's buffers, and the passes' scratch.
// Buffers grow (with headroom: crops vary from batch to batch) after waiting for the device,
// so growing is rare and never races a kernel still reading the old buffer.
template <class Backend>
class DevicePlannedInput {
 public:
  template <class U>
  using Buffer = typename Backend::template Buffer<U>;

  // Enqueues the copy of plan, lut (C, 256) and targets (n_targets, host) through pinned slot
  // `slot` (targets land in device_targets), then the passes on the op stream:
  // images (B, C, S', S') in T, S' = plan.out_side().
  template <class T>
  void expand(const data::PlannedBatch& plan, const std::vector<float>& lut, const float* targets,
              float* device_targets, Index n_targets, int slot, T* images) {
    const Index B = plan.size(), C = plan.C, S = plan.S;
    VIT_CHECK(slot == 0 || slot == 1, "planned input: slot must be 0 or 1");
    VIT_CHECK(lut.size() == size_t(C * 256), "planned input: the lookup table must be (C, 256)");
    Slot& s = slots_[slot];
    fit(s.pixels, plan.pixels.size());
    fit(s.tables, plan.tables.size());
    fit(s.samples, plan.samples.size());
    fit(s.lut, lut.size());
    fit(s.steps, plan.steps.size());
    fit(rows_, size_t(plan.scratch_bytes));
    fit(u8_, size_t(B * C * S * S));
    const std::vector<float>& noise = erase_noise_table();
    if (noise_.size() < noise.size()) {  // once: the table never changes
      noise_ = Buffer<float>(noise.size());
      Backend::upload(noise_.data(), noise.data(), Index(noise.size()));
    }
    void* dst[6] = {s.pixels.data(), s.tables.data(), s.samples.data(),
                    s.lut.data(),    s.steps.data(),  device_targets};
    const void* src[6] = {plan.pixels.data(), plan.tables.data(), plan.samples.data(),
                          lut.data(),         plan.steps.data(),  targets};
    const size_t bytes[6] = {plan.pixels.size(),
                             plan.tables.size() * sizeof(int32_t),
                             plan.samples.size() * sizeof(ResizeSample),
                             lut.size() * sizeof(float),
                             plan.steps.size() * sizeof(PixelStep),
                             targets ? size_t(n_targets) * sizeof(float) : 0};
    Backend::upload_input_n(dst, src, bytes, 6, slot);
    Backend::resize_rows(s.pixels.data(), s.tables.data(), s.samples.data(), B, C, S, rows_.data());
    Backend::resize_cols(rows_.data(), s.tables.data(), s.samples.data(), B, C, S, u8_.data());
    Backend::apply_pixel_steps(u8_.data(), s.steps.data(), plan.step_slots, B, C, S, plan.fill);
    if (plan.lowfreq.active())
      lowfreq_pass(plan, s, images);
    else
      Backend::normalize_u8(u8_.data(), s.lut.data(), noise_.data(), s.samples.data(), plan.mix, B,
                            C, S, images);
  }

 private:
  struct Slot;
  // EfficientTrain++ (expand_on_host's order): fp32 images at S, the low-frequency pass to S',
  // then the mix, rounded once to T.
  template <class T>
  void lowfreq_pass(const data::PlannedBatch& plan, const Slot& s, T* images) {
    const Index B = plan.size(), C = plan.C, S = plan.S, Sl = plan.lowfreq.side;
    const bool complex = plan.lowfreq.kind == LowFreqKind::kFft;
    fit(full_, size_t(B * C * S * S));
    fit(lowfreq_scratch_, cpu::lowfreq_scratch_floats(B * C, S, Sl, complex));
    fit(low_, size_t(B * C * Sl * Sl));
    if (op_kind_ != plan.lowfreq.kind || op_in_ != S || op_out_ != Sl) {  // a new training size
      const std::vector<float>& op = lowfreq_operator(plan.lowfreq.kind, S, Sl);  // (2, S', S)
      Backend::synchronize();  // the op stream may still read the old operator
      if (op_.size() < op.size()) op_ = Buffer<float>(op.size());
      Backend::upload(op_.data(), op.data(), Index(op.size()));
      op_kind_ = plan.lowfreq.kind;
      op_in_ = S;
      op_out_ = Sl;
    }
    Backend::normalize_u8(u8_.data(), s.lut.data(), noise_.data(), s.samples.data(), BatchMix{}, B,
                          C, S, full_.data());
    Backend::lowfreq_batch(full_.data(), op_.data(), complex, B * C, S, Sl, lowfreq_scratch_.data(),
                           low_.data());
    Backend::mix_images(low_.data(), plan.mix, B, C, Sl, images);
  }

  struct Slot {
    Buffer<uint8_t> pixels;        // the crops
    Buffer<int32_t> tables;        // the axis tables
    Buffer<ResizeSample> samples;  // (B)
    Buffer<float> lut;             // (C, 256)
    Buffer<PixelStep> steps;       // (B, step_slots)
  };
  template <class U>
  void fit(Buffer<U>& b, size_t n) {
    if (b.size() >= n) return;
    Backend::synchronize();  // the op stream may still read the old buffer
    b = Buffer<U>(n + n / 4);
  }
  Slot slots_[2];
  Buffer<uint8_t> rows_;  // the horizontal passes' output, each sample's (C, bh, S)
  Buffer<uint8_t> u8_;    // (B, C, S, S) before normalisation
  Buffer<float> noise_;   // (kEraseNoiseTable): erase_noise_table() on the device
  // EfficientTrain++'s low-frequency pass: the images at S (B, C, S, S), the products' scratch,
  // the images at S' (B, C, S', S') before the mix, and the operator (2, S', S) on the device.
  Buffer<float> full_, lowfreq_scratch_, low_, op_;
  LowFreqKind op_kind_ = LowFreqKind::kFft;
  Index op_in_ = 0, op_out_ = 0;  // the sides op_ maps between (0: none uploaded)
};

}  // namespace vit
