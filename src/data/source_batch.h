// Batches from any Source (samples of any size, decoded on demand). In-memory sources take
// make_batch's path (bitwise the batches they always had); streamed ones always go through the
// timm pipeline (timm_sample), one sample after another in the calling thread.
#pragma once
#include <cstdint>

#include "data/batch.h"
#include "data/source.h"

namespace vit::data {

// The shorter side a decoder must deliver for cfg: S for training (RandomResizedCrop / resize),
// ceil(S / crop_pct) for timm's eval resize. JPEG DCT scaling only kicks in when the stored
// image's short side is at least twice this (decode.h picks scales whose output stays >= it).
int decode_min_side(const BatchConfig& cfg, bool train);

// Reads sample idx into px, or the next readable sample after it (wrapping; an unreadable one
// is reported once); returns the index actually read. Throws vit::Error when none is readable.
Index read_or_replace(const Source& src, Index idx, int min_side, Planar& px);
// read_or_replace through Source::read_region: px holds the region `pick` chose.
Index read_region_or_replace(const Source& src, Index idx, int min_side, const RegionPicker& pick,
                             Planar& px);

// images (B, C, S, S), targets (B, K), labels (B) (may be null). Every sample's randomness comes
// from (seed, epoch, indices[b]). An unreadable sample is reported once (Source::
// report_unreadable) and replaced by the next readable sample in data-set order (wrapping), with
// that sample's label; throws vit::Error when no sample of the source is readable. K is the
// source's class count. In-memory sources use make_batch (its OpenMP loop); streamed ones are
// built serially in the calling thread (the Loader's workers parallelise over batches).
void make_source_batch(const Source& src, const Index* indices, Index B, const BatchConfig& cfg,
                       bool train, uint64_t seed, uint64_t epoch, float* images, float* targets,
                       int32_t* labels);

}  // namespace vit::data
