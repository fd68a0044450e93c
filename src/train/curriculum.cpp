#include "train/curriculum.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

#include "core/common.h"

namespace vit {

namespace {
std::string num(double v) {
  return std::to_string(v);
}
}  // namespace

int size_curriculum(int epoch, int init_size, int step, int every, int final_size, int patch) {
  VIT_CHECK(epoch >= 0, "size curriculum: epoch must be >= 0, got " + std::to_string(epoch));
  VIT_CHECK(init_size >= 1,
            "size curriculum: init size must be >= 1, got " + std::to_string(init_size));
  VIT_CHECK(step >= 0, "size curriculum: size step must be >= 0, got " + std::to_string(step));
  VIT_CHECK(every >= 1, "size curriculum: epoch step must be >= 1, got " + std::to_string(every));
  VIT_CHECK(patch >= 1, "size curriculum: patch size must be >= 1, got " + std::to_string(patch));
  VIT_CHECK(final_size >= patch, "size curriculum: final size " + std::to_string(final_size) +
                                     " is smaller than the patch size " + std::to_string(patch));
  const int64_t grown = int64_t(init_size) + int64_t(step) * int64_t(epoch / every);
  const int64_t size = std::min<int64_t>(final_size, grown);
  return std::max<int>(patch, int(size / patch) * patch);
}

namespace {
// The paper's per-model tables at 224 px (methods.md §2.3).
const std::vector<int>* named_et_table(const std::string& name) {
  static const std::vector<int> kDeit = {96, 96, 160, 160, 160, 160, 192, 192, 224, 224};
  static const std::vector<int> kSwin = {96, 96, 160, 160, 160, 160, 224, 224, 224, 224};
  static const std::vector<int> kConvnext = {160, 160, 160, 160, 160, 160, 224, 224, 224, 224};
  if (name == "deit") return &kDeit;
  if (name == "swin") return &kSwin;
  if (name == "convnext") return &kConvnext;
  return nullptr;
}

void check_final(int final_size, int patch) {
  VIT_CHECK(patch >= 1, "ET++ schedule: patch size must be >= 1, got " + std::to_string(patch));
  VIT_CHECK(final_size >= patch && final_size % patch == 0,
            "ET++ schedule: final size " + std::to_string(final_size) +
                " must be a positive multiple of the patch size " + std::to_string(patch));
}

EtSchedule scaled_table(const std::vector<int>& table224, int final_size, int patch) {
  EtSchedule s;
  s.final_size = final_size;
  for (int b : table224) {
    // nearest multiple of patch to b * final / 224, in exact integer arithmetic (ties round up)
    const int64_t den = int64_t(224) * patch;
    const int64_t units = (2 * int64_t(b) * final_size + den) / (2 * den);
    s.sizes.push_back(int(std::max<int64_t>(1, units) * patch));
  }
  return s;
}
}  // namespace

EtSchedule et_schedule_deit(int final_size, int patch) {
  return et_schedule("deit", final_size, patch);
}

EtSchedule et_schedule(const std::string& table, int final_size, int patch) {
  check_final(final_size, patch);
  if (const auto* named = named_et_table(table)) return scaled_table(*named, final_size, patch);
  // An explicit table: ten sizes in pixels at this final size.
  EtSchedule s;
  s.final_size = final_size;
  size_t pos = 0;
  while (pos <= table.size()) {
    const size_t comma = std::min(table.find(',', pos), table.size());
    const std::string item = table.substr(pos, comma - pos);
    char* end = nullptr;
    const long v = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
    VIT_CHECK(!item.empty() && end && *end == '\0' && v > 0 && v <= final_size && v % patch == 0,
              "--et-table '" + table +
                  "': use deit, swin, convnext or ten comma-separated sizes, each a multiple of "
                  "the patch size " +
                  std::to_string(patch) + " and at most the final size " +
                  std::to_string(final_size) + " (bad entry '" + item + "')");
    s.sizes.push_back(int(v));
    pos = comma + 1;
  }
  VIT_CHECK(s.sizes.size() == 10,
            "--et-table '" + table + "': needs ten sizes, got " + std::to_string(s.sizes.size()));
  return s;
}

bool is_named_et_table(const std::string& name) {
  return named_et_table(name) != nullptr;
}

int et_stage(double p) {
  VIT_CHECK(p >= 0, "ET++ schedule: progress must be >= 0, got " + num(p));  // also rejects NaN
  if (p >= 1) return 9;
  return std::min(9, int(std::floor(10.0 * p)));
}

int et_size(const EtSchedule& s, double p) {
  VIT_CHECK(s.sizes.size() == 10,
            "ET++ schedule: expected 10 stage sizes, got " + std::to_string(s.sizes.size()));
  return s.sizes[et_stage(p)];
}

int et_magnitude(double p) {
  return et_stage(p);
}

double et_compute_weight(int size, int final_size) {
  VIT_CHECK(size > 0 && final_size > 0, "ET++ compute weight: sizes must be positive, got " +
                                            std::to_string(size) + " and " +
                                            std::to_string(final_size));
  const double r = double(size) / double(final_size);
  return r * r;
}

double et_lr(double p, double base, double min_lr, double warmup_lr, double warmup_frac) {
  VIT_CHECK(p >= 0, "ET++ LR: progress must be >= 0, got " + num(p));
  VIT_CHECK(warmup_frac >= 0 && warmup_frac < 1,
            "ET++ LR: warm-up fraction must be in [0, 1), got " + num(warmup_frac));
  if (p < warmup_frac) return warmup_lr + p * (base - warmup_lr) / warmup_frac;
  if (p >= 1) return min_lr;
  return min_lr + 0.5 * (base - min_lr) * (1.0 + std::cos(M_PI * p));
}

ComputeBudget::ComputeBudget(double equiv_epochs_, int64_t epoch_images_, int final_size_)
    : equiv_epochs(equiv_epochs_), epoch_images(epoch_images_), final_size(final_size_) {
  VIT_CHECK(equiv_epochs > 0 && std::isfinite(equiv_epochs),
            "compute budget: equivalent epochs must be > 0, got " + num(equiv_epochs));
  VIT_CHECK(epoch_images > 0,
            "compute budget: images per epoch must be > 0, got " + std::to_string(epoch_images));
  VIT_CHECK(final_size > 0,
            "compute budget: final size must be > 0, got " + std::to_string(final_size));
}

double ComputeBudget::total() const {
  return equiv_epochs * double(epoch_images);
}

void ComputeBudget::add(int64_t images, int size) {
  VIT_CHECK(images >= 0, "compute budget: image count must be >= 0, got " + std::to_string(images));
  consumed += double(images) * et_compute_weight(size, final_size);
}

double ComputeBudget::progress() const {
  const double t = total();
  VIT_CHECK(t > 0, "compute budget: total compute is zero (budget not configured)");
  return std::clamp(consumed / t, 0.0, 1.0);
}

bool ComputeBudget::done() const {
  return consumed >= total();
}

}  // namespace vit
