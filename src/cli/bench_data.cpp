#include "cli/bench_data.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>

#include "cli/train_args.h"
#include "core/common.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/planned_batch.h"
#include "data/source.h"
#include "data/stage_clock.h"
#include "train/batch_config.h"

namespace vit {

int run_bench_data(int argc, char** argv) {
  CLI::App app{
      "Measure the training input pipeline: decode + RandomResizedCrop + flip + "
      "normalise, images/s",
      "bench-data"};
  std::string data_dir, interpolation = "bilinear";
  int img_size = 224, workers = 1, batch = 64, batches = 16;
  bool json = false, planned = false;
  app.add_option("--data-dir", data_dir, "ImageFolder root or vitrain prepare output")->required();
  app.add_option("--img-size", img_size, "output side")->check(CLI::PositiveNumber);
  app.add_option("-j,--workers", workers, "loader threads (0 = all cores)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("-b,--batch-size", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--batches", batches, "timed batches")->check(CLI::PositiveNumber);
  app.add_option("--interpolation", interpolation, "bilinear (torchvision's default) or bicubic")
      ->check(CLI::IsMember({"bilinear", "bicubic"}));
  app.add_flag("--planned", planned,
               "workers decode and plan (crop box, flip, PIL tables) and leave the resize, flip "
               "and normalisation to the device's batched ops: the CPU side of that path");
  app.add_flag("--json", json, "print one JSON line instead of text");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string m = e.what();
    std::replace(m.begin(), m.end(), '\n', ' ');
    throw Error(fmt::format("bench-data: {}", m));
  }

  const data::DataSplits d = data::load_data_dir(data_dir);
  VIT_CHECK(d.streamed(), fmt::format("bench-data: '{}' holds {} data (in memory); point it at an "
                                      "ImageFolder root or a vitrain prepare folder",
                                      data_dir, d.format));
  TrainArgs a;
  a.train_interpolation = interpolation;
  const data::BatchConfig cfg = train_batch_config(a, img_size, d.mean, d.std, true);
  data::Loader loader(*d.train, batch, true, 42, {workers});
  VIT_CHECK(loader.batches_per_epoch() > 0,
            fmt::format("bench-data: batch size {} exceeds the {} training images", batch,
                        d.train->size()));
  const Index C = d.train->channels(), K = d.train->num_classes();
  std::vector<float> images(size_t(batch) * C * img_size * img_size);  // (B, C, S, S)
  std::vector<float> targets(size_t(batch) * K);                       // (B, K)
  const Index nb = loader.batches_per_epoch();
  data::PlannedBatch plan;
  double shipped_bytes = 0;  // what would travel to the device, timed batches
  auto load = [&](Index i) {
    if (!planned) {
      loader.load(uint64_t(i / nb), i % nb, cfg, images.data(), targets.data());
      shipped_bytes += double(images.size() * sizeof(float));
      return;
    }
    loader.load_planned(uint64_t(i / nb), i % nb, cfg, plan, targets.data());
    shipped_bytes += double(plan.pixels.size() + plan.tables.size() * sizeof(int32_t) +
                            plan.samples.size() * sizeof(ResizeSample));
  };
  data::stage_clock_enable(true);
  load(0);  // warm-up: starts the workers, fills the page cache
  // The workers may already build the next batches: the stage sums cover whatever they did
  // from here to the end, which is the timed window up to the prefetch of its last batches.
  data::stage_clock_reset();
  shipped_bytes = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (Index i = 1; i <= batches; ++i) load(i);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const data::StageTotals st = data::stage_clock_totals();
  data::stage_clock_enable(false);
  const double ips = double(batch) * batches / sec;
  const double bytes_per_img = shipped_bytes / (double(batch) * batches);
  const int w = std::max(1, loader.workers());
  // Shares of the workers' time (workers x wall); what no stage holds is queueing, idling and
  // the loop's own bookkeeping. The copy runs in the caller's thread, outside the workers.
  std::string shares, shares_json;
  for (int i = 0; i < data::kNumStages; ++i) {
    const auto stage = data::Stage(i);
    const double share = 100.0 * st.seconds[i] / (sec * w);
    shares += fmt::format("{}{} {:.1f}%", i ? ", " : "", data::stage_name(stage), share);
    shares_json += fmt::format(",\"{}_pct\":{:.2f}", data::stage_name(stage), share);
  }
  if (json)
    fmt::print(
        "{{\"impl\":\"vitrain\",\"format\":\"{}\",\"img_size\":{},\"workers\":{},"
        "\"planned\":{},\"img_per_s\":{:.1f},\"img_per_s_per_worker\":{:.1f},"
        "\"bytes_per_img\":{:.0f}{}}}\n",
        d.format, img_size, w, planned, ips, ips / w, bytes_per_img, shares_json);
  else
    fmt::print(
        "{} {}: {} px, {} workers{}: {:.1f} img/s ({:.1f} per worker), {} unreadable\n"
        "  {:.0f} bytes per image to the device ({})\n"
        "  share of worker time: {}\n",
        d.format, data_dir, img_size, w, planned ? ", planned" : "", ips, ips / w,
        d.train->unreadable_count(), bytes_per_img,
        planned ? "uint8 crops + tables" : "float images", shares);
  return 0;
}

}  // namespace vit
