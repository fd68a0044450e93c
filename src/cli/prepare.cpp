#include "cli/prepare.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>

#include "core/common.h"
#include "data/image_folder.h"
#include "data/packed.h"
#include "io/atomic_file.h"

namespace vit {

namespace fs = std::filesystem;

int run_prepare(int argc, char** argv) {
  CLI::App app{
      "Pack an ImageFolder root (train/<class>/*.jpg, val/<class>/*.jpg) into OUT/train.vitpack "
      "and OUT/val.vitpack for fast loading; train with --data-dir OUT",
      "prepare"};
  std::string data_dir, out, format = "jpeg", class_map;
  int max_side = 256, quality = 90, workers = 0;
  app.add_option("--data-dir", data_dir, "ImageFolder root with a train and a val split")
      ->required();
  app.add_option("--out", out, "output folder (created) for train.vitpack and val.vitpack")
      ->required();
  app.add_option("--max-side", max_side, "downscale so the longer side is <= this (0 = keep)");
  app.add_option("--format", format, "jpeg or raw (uint8 pixels)");
  app.add_option("--quality", quality, "JPEG quality 1..100");
  app.add_option("-j,--workers", workers, "decoding threads (0 = all cores)");
  app.add_option("--class-map", class_map, "class order, one name per line (default: sorted)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return 0;
  } catch (const CLI::ParseError& e) {
    std::string m = e.what();
    std::replace(m.begin(), m.end(), '\n', ' ');
    throw Error(fmt::format("prepare: {}", m));
  }
  VIT_CHECK(format == "jpeg" || format == "raw",
            fmt::format("prepare: --format {}: use jpeg or raw", format));
  VIT_CHECK(max_side >= 0 && max_side <= 65535, "prepare: --max-side must be in 0..65535");
  VIT_CHECK(quality >= 1 && quality <= 100, "prepare: --quality must be in 1..100");
  VIT_CHECK(workers >= 0, "prepare: --workers must be >= 0");
  VIT_CHECK(fs::is_directory(data_dir),
            fmt::format("prepare: data folder '{}' does not exist", data_dir));

  // Both splits are indexed before anything is written, so a bad layout fails fast.
  const data::FolderIndex train = data::index_image_folder(
      data::find_split(data_dir, true),
      class_map.empty() ? std::vector<std::string>{} : data::read_class_map(class_map));
  const data::FolderIndex val =
      data::index_image_folder(data::find_split(data_dir, false), train.classes);
  std::error_code ec;
  fs::create_directories(out, ec);
  VIT_CHECK(!ec && fs::is_directory(out),
            fmt::format("prepare: cannot create output folder '{}': {}", out,
                        ec ? ec.message() : "a file of that name exists"));
  // A prepare killed mid-write leaves only "<pack>.tmp.<pid>" (the pack is renamed into place
  // when complete), so a re-run redoes the splits; it first removes those dead writers' files,
  // which at ImageNet's scale are gigabytes each.
  if (const int stale = io::remove_stale_temp_files(out))
    fmt::print(stderr, "prepare: removed {} temp file(s) of an interrupted run in {}\n", stale,
               out);
  const bool jpeg = format == "jpeg";
  const data::PackStats tr =
      data::write_packed(out + "/train.vitpack", train, max_side, jpeg, quality, workers);
  const data::PackStats va =
      data::write_packed(out + "/val.vitpack", val, max_side, jpeg, quality, workers);
  fmt::print(
      "Prepared {}: {} train + {} val images ({} classes, {}, max side {}), {} skipped, "
      "{:.1f} MiB; train with --data-dir {}\n",
      out, tr.written, va.written, train.classes.size(),
      jpeg ? fmt::format("JPEG q{}", quality) : std::string("raw"), max_side,
      tr.skipped + va.skipped, double(tr.bytes + va.bytes) / (1 << 20), out);
  return 0;
}

}  // namespace vit
