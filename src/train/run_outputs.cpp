#include "train/run_outputs.h"

#include <fmt/format.h>

#include "io/atomic_file.h"
#include "train/resize_model.h"

namespace vit {

RunOutputs::RunOutputs(std::string dir, const ModelConfig& final_cfg, Metadata data_meta,
                       int64_t first_epoch, int64_t first_step, const std::string& plot_title)
    : summary(dir.empty() ? dir : dir + "/summary.csv", first_epoch),
      log(dir.empty() ? dir : dir + "/log.jsonl"),
      dir_(std::move(dir)),
      final_cfg_(final_cfg),
      final_table_(build_param_table(final_cfg)),
      data_meta_(std::move(data_meta)) {
  plot.title = plot_title;
  if (!writes()) return;
  // A kill -9 inside a checkpoint write leaves its temp file: a resume clears them away.
  if (const int n = io::remove_stale_temp_files(dir_))
    fmt::print("Removed {} temp file(s) of writes interrupted in {}\n", n, dir_);
  // Rebuild the curves of the epochs before a resume from the log.
  load_plot_from_jsonl(dir_ + "/log.jsonl", plot, first_step);
}

void RunOutputs::write_run_files(const std::string& args_yaml,
                                 const std::vector<std::string>& classes) {
  if (!writes()) return;
  io::write_file_atomic(dir_ + "/args.yaml", args_yaml);
  std::string lines;
  for (const auto& n : classes) lines += n + "\n";
  io::write_file_atomic(dir_ + "/classes.txt", lines);
}

void RunOutputs::save_weights(const std::string& name, Engine& engine, const ModelConfig& current,
                              const Metadata& extra) {
  if (!writes()) return;
  Metadata meta = data_meta_;
  for (const auto& [k, v] : extra) meta[k] = v;
  const std::vector<float> params = engine.read_params();
  const std::string path = dir_ + "/" + name;
  if (current.img_size == final_cfg_.img_size) {
    vit::save_weights(path, final_cfg_, final_table_, params.data(), meta);
    return;
  }
  std::vector<float> p(size_t(final_table_.total));
  map_buffer(current, engine.table(), params.data(), final_cfg_, final_table_, p.data(), false);
  vit::save_weights(path, final_cfg_, final_table_, p.data(), meta);
}

void RunOutputs::save_state(Engine& engine, const ModelConfig& current, TrainState& st) {
  st.step = engine.num_steps();
  // On every rank: with a sharded optimizer reading the moments is a collective.
  engine.read_moments(st.exp_avg, st.exp_avg_sq);
  st.ema = engine.has_ema() ? engine.read_ema() : std::vector<float>{};
  if (!writes()) return;
  save_train_state(dir_ + "/state.safetensors", current, engine.table(),
                   engine.read_params().data(), st);
  write_kernel_plan(engine);
}

void RunOutputs::write_kernel_plan(const Engine& engine) {
  if (!writes()) return;
  io::write_file_atomic(dir_ + "/kernels.json", engine.kernel_plan().dump(1) + "\n");
}

void RunOutputs::write_plot() {
  if (!writes()) return;
  write_training_plot(dir_ + "/plot.png", plot);
}

}  // namespace vit
