#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/profile.h"
#include "core/rng.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "io/atomic_file.h"
#include "io/plot.h"
#include "model/vit.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/initial_checkpoint.h"
#include "train/optimizer.h"
#include "train/run_log.h"
#include "train/schedule.h"

namespace vit {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) { g_stop_requested = true; }

// The model a run trains: the preset, adapted to the data and the flags.
ModelConfig model_for_run(const TrainArgs& a, const data::DataSplits& d) {
  ModelConfig cfg = model_preset(a.model);
  if (a.img_size > 0) cfg.img_size = a.img_size;
  cfg.in_chans = int(d.train.channels);
  cfg.num_classes = a.num_classes > 0 ? a.num_classes : d.train.num_classes;
  VIT_CHECK(cfg.num_classes >= d.train.num_classes,
            fmt::format("--num-classes {} is smaller than the {} classes in the data",
                        cfg.num_classes, d.train.num_classes));
  if (!a.gp.empty()) cfg.classifier = classifier_from_string(a.gp);
  if (!a.ffn.empty()) cfg.ffn = ffn_from_string(a.ffn);
  cfg.drop_path = a.drop_path;
  cfg.validate();
  return cfg;
}

std::string state_path_of(const std::string& resume) {
  const std::string p = fs::is_directory(resume) ? resume + "/state.safetensors" : resume;
  if (!fs::is_regular_file(p))
    throw Error(fmt::format("--resume: no training state at '{}'", p));
  return p;
}

std::string format_duration(double s) {
  const long t = long(std::max(0.0, s));
  return fmt::format("{}:{:02d}:{:02d}", t / 3600, int(t / 60 % 60), int(t % 60));
}

}  // namespace

int run_train(const TrainArgs& args) {
  if (args.device == "cuda")
    throw Error("this build has no CUDA backend (CUDA was not found at build time); use --device cpu");
  if (args.workers > 0) omp_set_num_threads(args.workers);

  const data::DataSplits data = data::load_data_dir(args.data_dir);
  const ModelConfig cfg = model_for_run(args, data);
  const Index B = args.batch_size, accum = args.grad_accum_steps;
  const Index upe = data.train.n / (B * accum);  // optimizer updates per epoch (drop last)
  VIT_CHECK(upe > 0, fmt::format("batch size {} x {} accumulation steps exceeds the {} training "
                                 "images",
                                 B, accum, data.train.n));

  std::optional<TrainState> resumed;
  std::string run_dir;
  if (!args.resume.empty()) {
    const std::string sp = state_path_of(args.resume);
    resumed = load_train_state(sp);
    run_dir = fs::path(sp).parent_path().string();
    VIT_CHECK(model_config_to_json(resumed->weights.cfg) == model_config_to_json(cfg),
              fmt::format("--resume: the state in '{}' is for a different model than the "
                          "flags describe",
                          sp));
  } else {
    run_dir = make_run_dir(args.output, args.experiment, cfg.name, cfg.img_size);
  }

  Vit<float> model(cfg, B);
  AdamW<float> opt(model.table().total, model.table().num_decay,
                   AdamWConfig{0.9, 0.999, 1e-8, args.weight_decay, args.clip_grad});
  TrainState st;
  if (resumed) {
    st = std::move(*resumed);
    model.params = st.weights.params;
    opt.m = st.exp_avg;
    opt.v = st.exp_avg_sq;
    opt.step_ = st.step;
  } else {
    init_params(model.params.data(), model.table(), cfg, args.seed);
    if (!args.initial_checkpoint.empty())
      load_initial_checkpoint(args.initial_checkpoint, cfg, model.table(), model.params.data(),
                              stdout);
  }
  st.args_yaml = to_yaml(args);
  io::write_file_atomic(run_dir + "/args.yaml", st.args_yaml);
  {
    std::string classes;
    for (const auto& n : data.train.class_names) classes += n + "\n";
    io::write_file_atomic(run_dir + "/classes.txt", classes);
  }

  const LrSchedule sched{args.lr, args.min_lr, args.warmup_lr, args.warmup_epochs * upe,
                         double(args.epochs) * upe};
  data::BatchConfig train_bc{cfg.img_size, args.crop_pad, args.hflip, args.smoothing, data.mean,
                             data.std};
  data::BatchConfig eval_bc{cfg.img_size, 0, 0.0, 0.0, data.mean, data.std};

  SummaryCsv summary(run_dir + "/summary.csv", st.epoch);
  JsonlLog jlog(run_dir + "/log.jsonl");
  PlotData plot;
  plot.title = fmt::format("{} on {}", cfg.name, args.data_dir);
  // Rebuild the curves of the epochs before a resume from the log.
  load_plot_from_jsonl(run_dir + "/log.jsonl", plot, st.step);

  // What eval/export need to reproduce the input pipeline and name the classes.
  const Metadata data_meta = {{"mean", nlohmann::json(data.mean).dump()},
                              {"std", nlohmann::json(data.std).dump()},
                              {"label_names", nlohmann::json(data.train.class_names).dump()}};
  const double flops_per_img = 3.0 * cfg.forward_flops_per_image();
  fmt::print("Model {} ({} params, {:.1f} MFLOP/img train), data {} ({} train / {} eval, {} "
             "classes), {} updates/epoch, batch {} x {}, lr {:.3g}, run {}\n",
             cfg.name, model.table().total, flops_per_img / 1e6, args.data_dir, data.train.n,
             data.val.n, cfg.num_classes, upe, B, accum, args.lr, run_dir);
  if (resumed) fmt::print("Resumed at epoch {} update {} (step {})\n", st.epoch, st.update_in_epoch, st.step);
  std::fflush(stdout);

  g_stop_requested = false;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const bool tty = stdout_is_tty();

  std::vector<float> images(B * cfg.in_chans * cfg.img_size * cfg.img_size);
  std::vector<float> targets(B * cfg.num_classes);
  const double elapsed_before = st.elapsed_s;
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return elapsed_before +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  auto save_state = [&](int64_t epoch, int64_t update_in_epoch) {
    st.step = opt.step_;
    st.epoch = epoch;
    st.update_in_epoch = update_in_epoch;
    st.elapsed_s = elapsed();
    st.exp_avg = opt.m;
    st.exp_avg_sq = opt.v;
    save_train_state(run_dir + "/state.safetensors", cfg, model.table(), model.params.data(), st);
  };

  bool stopped_early = false;
  for (int64_t epoch = st.epoch; epoch < args.epochs && !stopped_early; ++epoch) {
    const std::vector<Index> order = data::epoch_order(data.train.n, args.seed, epoch);
    const int64_t first_update = epoch == st.epoch ? st.update_in_epoch : 0;
    double loss_sum = 0, loss_avg_window = 0;
    int64_t loss_count = 0, window = 0;
    auto t_window = std::chrono::steady_clock::now();
    const double t_epoch0 = elapsed();
    for (int64_t u = first_update; u < upe; ++u) {
      const double lr = sched.at(double(opt.step_));
      model.zero_grad();
      double loss = 0;
      for (Index a = 0; a < accum; ++a) {
        const Index* idx = order.data() + (u * accum + a) * B;
        data::make_batch(data.train, idx, B, train_bc, true, args.seed, uint64_t(epoch),
                         images.data(), targets.data());
        loss += model.forward(images.data(), targets.data(), B, true,
                              mix_seed(args.seed, uint64_t(opt.step_), uint64_t(a)));
        model.backward(1.0f / float(B * accum));
      }
      loss /= double(accum);
      if (!std::isfinite(loss))
        throw Error(fmt::format("loss is {} at epoch {} update {}: training diverged (try a "
                                "lower --lr or --clip-grad)",
                                loss, epoch, u));
      const double gnorm = opt.step(model.params.data(), model.grads.data(), lr);
      loss_sum += loss;
      ++loss_count;
      loss_avg_window += loss;
      ++window;
      const bool last = u + 1 == upe;
      if ((u + 1) % args.log_interval == 0 || last) {
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_window).count();
        const double ips = double(window * B * accum) / std::max(dt, 1e-9);
        const double remaining_updates = double(upe - u - 1) + double(upe) * (args.epochs - epoch - 1);
        const double eta = remaining_updates * dt / std::max<int64_t>(window, 1);
        TrainLine line{epoch,   u + 1,           upe, loss, loss_sum / loss_count,
                       dt / window, ips, lr,   eta};
        const std::string text = format_train_line(line);
        if (tty)
          fmt::print("\r{}\033[K", text);
        else
          fmt::print("{}\n", text);
        std::fflush(stdout);
        jlog.write({{"type", "train"},
                    {"epoch", epoch},
                    {"update", u + 1},
                    {"step", opt.step_},
                    {"loss", loss},
                    {"loss_avg", loss_sum / loss_count},
                    {"loss_window", loss_avg_window / window},
                    {"lr", lr},
                    {"grad_norm", gnorm},
                    {"img_per_s", ips},
                    {"gflops", ips * flops_per_img / 1e9},
                    {"elapsed_s", elapsed()}});
        plot.train_loss.push_back({elapsed(), loss_avg_window / window});
        plot.lr.push_back({elapsed(), lr});
        loss_avg_window = 0;
        window = 0;
        t_window = std::chrono::steady_clock::now();
      }
      const bool stop_test = args.stop_after_updates > 0 && opt.step_ >= args.stop_after_updates;
      if (g_stop_requested || stop_test) {
        if (tty) fmt::print("\n");
        save_state(epoch, u + 1);
        fmt::print("Stopped at epoch {} update {}; state saved. Continue with: vitrain train "
                   "--resume {}\n",
                   epoch, u + 1, run_dir);
        return stop_test ? 0 : 130;
      }
    }
    if (tty) fmt::print("\n");
    const double train_seconds = elapsed() - t_epoch0;
    if (Profile::enabled()) {  // VIT_PROFILE=1: where this epoch's time went
      Profile::print(stdout);
      Profile::reset();
    }

    const bool do_eval = (epoch + 1) % args.eval_interval == 0 || epoch + 1 == args.epochs;
    if (!do_eval) {
      save_state(epoch + 1, 0);
      continue;
    }
    const EvalResult ev = evaluate(model, data.val, eval_bc, B);
    fmt::print("{}\n", format_eval_line(epoch, ev.loss, ev.top1, ev.top5));
    const double lr_now = sched.at(double(opt.step_));
    const double ips = double((upe - first_update) * B * accum) / std::max(train_seconds, 1e-9);
    summary.append({epoch, loss_count ? loss_sum / loss_count : 0.0, ev.loss, ev.top1, ev.top5,
                    lr_now, cfg.img_size, elapsed(), ips});
    jlog.write({{"type", "eval"},
                {"epoch", epoch},
                {"step", opt.step_},
                {"eval_loss", ev.loss},
                {"eval_top1", ev.top1},
                {"eval_top5", ev.top5},
                {"elapsed_s", elapsed()}});
    plot.eval_loss.push_back({elapsed(), ev.loss});
    plot.eval_top1.push_back({elapsed(), ev.top1});

    Metadata meta = data_meta;
    meta["epoch"] = std::to_string(epoch);
    meta["eval_top1"] = fmt::format("{:.4f}", ev.top1);
    save_weights(run_dir + "/last.safetensors", cfg, model.table(), model.params.data(), meta);
    if (ev.top1 > st.best_metric) {
      st.best_metric = ev.top1;
      st.best_epoch = epoch;
      st.bad_epochs = 0;
      save_weights(run_dir + "/model_best.safetensors", cfg, model.table(), model.params.data(),
                   meta);
    } else {
      ++st.bad_epochs;
    }
    if (args.patience > 0 && st.bad_epochs >= args.patience) {
      fmt::print("Early stopping: no top-1 improvement for {} evaluations\n", st.bad_epochs);
      stopped_early = true;
    }
    save_state(stopped_early ? args.epochs : epoch + 1, 0);
    write_training_plot(run_dir + "/plot.png", plot);
  }
  fmt::print("*** Best metric: {:.3f} (epoch {})\n", st.best_metric, st.best_epoch);
  const auto& rows = summary.rows();
  if (!rows.empty())
    fmt::print("Final test top-1: {:.2f}%  top-5: {:.2f}%  loss: {:.4f}  ({} of training)\n",
               rows.back().eval_top1, rows.back().eval_top5, rows.back().eval_loss,
               format_duration(elapsed()));
  fmt::print("Run folder: {}\n", run_dir);
  return 0;
}

}  // namespace vit
