#include "train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/gpu_stats.h"
#include "core/profile.h"
#include "core/rng.h"
#include "data/augment.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/source.h"
#include "dist/comm.h"
#include "io/atomic_file.h"
#include "io/plot.h"
#include "train/batch_config.h"
#include "train/budget.h"
#include "train/checkpoint.h"
#include "train/curriculum.h"
#include "train/engine.h"
#include "train/evaluate.h"
#include "train/initial_checkpoint.h"
#include "train/resize_model.h"
#include "train/run_log.h"
#include "train/run_outputs.h"
#include "train/run_plan.h"
#include "train/schedule.h"
#include "train/train_batches.h"

namespace vit {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop_requested{false};
extern "C" void on_stop_signal(int) {
  g_stop_requested = true;
}

// Fault injection for the tests (VIT_TEST_NONFINITE_UPDATES="3,5-7": those 1-based updates get a
// NaN loss scale, hence NaN gradients): exercises the non-finite guard on any backend.
std::vector<std::pair<int64_t, int64_t>> injected_nonfinite_updates() {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const char* env = std::getenv("VIT_TEST_NONFINITE_UPDATES");
  if (!env) return ranges;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    long long a = 0, b = 0;
    if (std::sscanf(item.c_str(), "%lld-%lld", &a, &b) == 2)
      ranges.push_back({a, b});
    else if (std::sscanf(item.c_str(), "%lld", &a) == 1)
      ranges.push_back({a, a});
    else
      throw Error(fmt::format("VIT_TEST_NONFINITE_UPDATES: bad item '{}'", item));
  }
  return ranges;
}

double mean_or_nan(double sum, int64_t n) {
  return n > 0 ? sum / double(n) : std::nan("");
}

std::string state_path_of(const std::string& resume) {
  const std::string p = fs::is_directory(resume) ? resume + "/state.safetensors" : resume;
  if (!fs::is_regular_file(p)) throw Error(fmt::format("--resume: no training state at '{}'", p));
  return p;
}

// What data parallelism (mpirun) supports so far: the global batch splits evenly over the
// ranks, and every stop decision is one the ranks reach alike (no wall-clock budget, whose
// clock each rank reads for itself; no replay buffer, which mixes samples across a batch).
void check_data_parallel(const RunPlan& plan, int world) {
  if (world == 1) return;
  VIT_CHECK(plan.batch % world == 0 && plan.max_samples % world == 0,
            fmt::format("data parallel: the batch size {} must be a multiple of the {} ranks",
                        plan.batch, world));
  VIT_CHECK(!plan.budget,
            "data parallel: --budget is not supported yet (each rank reads its own "
            "clock); use --epochs");
  VIT_CHECK(plan.replay <= 1, "data parallel: --replay is not supported yet");
}

std::string format_duration(double s) {
  const long t = long(std::max(0.0, s));
  return fmt::format("{}:{:02d}:{:02d}", t / 3600, int(t / 60 % 60), int(t % 60));
}

}  // namespace

int run_train(const TrainArgs& args, const std::string& args_yaml) {
  const std::string device = resolve_device(args.device);  // before any work: a clear error
  if (args.workers > 0) omp_set_num_threads(args.workers);
  // Data parallel (mpirun; torchrun / srun on GPUs): rank 0 prints, logs and writes; the
  // others compute.
  VIT_CHECK(args.dist_timeout >= 0, "--dist-timeout must be >= 0 seconds");
  const std::shared_ptr<Comm> comm = make_run_comm(device, args.dist_timeout);
  const int rank = comm->rank(), world = comm->size();
  comm->set_timeout(args.dist_timeout);
  if (rank > 0 && !std::freopen("/dev/null", "w", stdout))
    throw Error("cannot silence stdout on a worker rank");

  const data::DataSplits data = data::load_data_dir(
      args.data_dir,
      args.class_map.empty() ? std::vector<std::string>{} : data::read_class_map(args.class_map));
  VIT_CHECK(args.class_map.empty() || data.streamed(),
            fmt::format("--class-map applies to ImageFolder and packed data, not to the {} data "
                        "in '{}'",
                        data.format, args.data_dir));
  const RunPlan plan = plan_run(args, data);
  const Index n_train = data.train->size(), n_val = data.val->size();
  const ModelConfig& final_cfg = plan.final_cfg;
  const int F = plan.final_size;
  check_data_parallel(plan, world);
  // B, cap: this rank's samples per forward pass (the global batch is split over the ranks).
  const Index B = plan.batch / world, accum = plan.accum, upe = plan.updates_per_epoch;
  const bool et = plan.efficienttrain, open_ended = plan.open_ended();
  const int eval_size = plan.eval_size, R = plan.replay;
  const std::optional<TimeBudget>& budget = plan.budget;
  const Index cap = plan.max_samples / world;  // samples per forward pass with replay

  std::optional<TrainState> resumed;
  std::string run_dir;
  ModelConfig cfg = final_cfg;  // the current training size
  if (!args.resume.empty()) {
    const std::string sp = state_path_of(args.resume);
    resumed = load_train_state(sp);
    run_dir = fs::path(sp).parent_path().string();
    cfg.img_size = resumed->weights.cfg.img_size;  // the state is at its training size
    VIT_CHECK(model_config_to_json(resumed->weights.cfg) == model_config_to_json(cfg),
              fmt::format("--resume: the state in '{}' is for a different model than the "
                          "flags describe",
                          sp));
  } else {
    if (rank == 0)
      run_dir = make_run_dir(args.output, args.experiment, final_cfg.name, final_cfg.img_size);
    run_dir = broadcast_string(*comm, run_dir, 0);
  }

  EngineOptions engine_opt;
  engine_opt.device = device;
  engine_opt.precision = args.precision;
  engine_opt.cfg = cfg;
  engine_opt.max_batch = cap;
  engine_opt.max_img_size = std::max(F, cfg.img_size);  // curricula never exceed the final size
  engine_opt.adamw = AdamWConfig{0.9, 0.999, 1e-8, args.weight_decay, args.clip_grad};
  const bool ema = args.model_ema;
  engine_opt.ema = ema;
  engine_opt.comm = comm;
  engine_opt.shard_optimizer = args.shard_optimizer;
  std::unique_ptr<Engine> engine = make_engine(engine_opt);
  TrainState st;
  if (resumed) {
    st = std::move(*resumed);
    engine->write_params(st.weights.params);
    engine->write_moments(st.exp_avg, st.exp_avg_sq, st.step);
    if (ema) {
      if (st.ema.empty())
        fmt::print("Model EMA: the state has none; it starts from the resumed weights\n");
      engine->write_ema(st.ema.empty() ? st.weights.params : st.ema);
    }
  } else {
    std::vector<float> p(size_t(engine->table().total), 0.0f);
    init_params(p.data(), engine->table(), cfg, args.seed);
    if (!args.initial_checkpoint.empty())
      load_initial_checkpoint(args.initial_checkpoint, cfg, engine->table(), p.data(), stdout);
    engine->write_params(p);
    if (ema) engine->write_ema(p);  // timm copies the model at the start
  }
  st.args_yaml = args_yaml;
  // What eval/export need to reproduce the input pipeline and name the classes.
  const Metadata data_meta = {{"mean", nlohmann::json(data.mean).dump()},
                              {"std", nlohmann::json(data.std).dump()},
                              {"label_names", nlohmann::json(data.train->class_names()).dump()}};
  RunOutputs out(rank == 0 ? run_dir : std::string(), final_cfg, data_meta, st.epoch, st.step,
                 fmt::format("{} on {}", final_cfg.name, args.data_dir));
  out.write_run_files(st.args_yaml, data.train->class_names());
  ComputeBudget compute(double(args.epochs), int64_t(n_train), F);
  compute.consumed = st.compute_consumed;

  // Streamed data (photos of any size) is evaluated as timm does: resize + centre crop.
  const data::BatchConfig eval_bc =
      eval_batch_config(args, eval_size, data.mean, data.std, data.streamed());

  const double flops_per_img = 3.0 * final_cfg.forward_flops_per_image();
  fmt::print(
      "Model {} ({} params, {:.1f} MFLOP/img train), data {} ({} train / {} eval, {} "
      "classes), {} updates/epoch, batch {} x {}, lr {:.3g}, run {}\n",
      final_cfg.name, engine->table().num_params, flops_per_img / 1e6, args.data_dir, n_train,
      n_val, cfg.num_classes, upe, B, accum, args.lr, run_dir);
  fmt::print("Device: {}\n", engine->description());
  if (world > 1)
    fmt::print("Data parallel: {} ranks ({}), {} samples per rank per micro-batch{}\n", world,
               comm->name(), B, args.shard_optimizer ? ", sharded optimizer (ZeRO-1)" : "");
  if (args.curriculum != "none" || budget || R > 1)
    fmt::print("Seed methods: curriculum {}{}, final size {}, eval size {}, budget {}, replay {}\n",
               args.curriculum,
               et ? fmt::format(" (lowfreq {}, sizes {}, warm-up {:.3g})", args.lowfreq,
                                fmt::join(plan.et.sizes, "/"), args.et_warmup)
                  : std::string(),
               F, eval_size, budget ? fmt::format("{:.0f}s", budget->total_s) : "none", R);
  if (resumed)
    fmt::print("Resumed at epoch {} update {} (step {}), training size {}\n", st.epoch,
               st.update_in_epoch, st.step, cfg.img_size);
  std::fflush(stdout);

  g_stop_requested = false;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  const bool tty = stdout_is_tty();
  // On the host reading the loss is free: check every update. On the GPU only at log points.
  const bool read_every_step = !engine->on_gpu();
  // GPU utilisation, memory, power and clock in the log (NVML, when the driver has it).
  std::unique_ptr<GpuMonitor> gpu_monitor;
  if (engine->on_gpu()) gpu_monitor = std::make_unique<GpuMonitor>();

  TrainBatches batches(args, plan, data, cfg.img_size, engine->num_steps(), rank, world);
  if (batches.workers() > 0) {
    fmt::print("Data: {} ({}), {} loader workers\n", data.format, args.data_dir, batches.workers());
    std::fflush(stdout);
  }
  auto unreadable = [&] { return data.train->unreadable_count() + data.val->unreadable_count(); };

  const double elapsed_before = st.elapsed_s;
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return elapsed_before +
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  // Fraction of the schedule done: the time budget, else ET++'s compute, else epochs.
  auto fraction = [&](int64_t epoch, int64_t update) {
    if (budget) return budget->fraction(elapsed());
    if (et) return compute.progress();
    return std::min(1.0, (double(epoch) + double(update) / double(upe)) / double(args.epochs));
  };
  // Moves the model and its AdamW moments to another training size (pos_embed resampled).
  auto set_train_size = [&](int size, int64_t epoch, int64_t update, double frac) {
    if (size == cfg.img_size) return;
    std::vector<float> m, v;
    engine->read_moments(m, v);
    ResizedBuffers r = resize_model(cfg, engine->table(), engine->read_params(), m, v, size);
    std::vector<float> ema_resized;
    if (ema) {  // the EMA follows the weights (pos_embed resampled the same way)
      ema_resized.resize(size_t(r.table.total));
      map_buffer(cfg, engine->table(), engine->read_ema().data(), r.cfg, r.table,
                 ema_resized.data(), false);
    }
    engine->set_img_size(size);  // same buffers, new table
    engine->write_params(r.params);
    engine->write_moments(r.m, r.v, engine->num_steps());
    if (ema) engine->write_ema(ema_resized);
    fmt::print("{}Size: {} -> {} px at epoch {} update {} (progress {:.3f}{})\n", tty ? "\n" : "",
               cfg.img_size, size, epoch, update, frac,
               et ? fmt::format(", stage {}, magnitude {}", et_stage(frac), et_magnitude(frac))
                  : std::string());
    std::fflush(stdout);
    out.log.write({{"type", "size"},
                   {"epoch", epoch},
                   {"update", update},
                   {"step", engine->num_steps()},
                   {"from", cfg.img_size},
                   {"img_size", size},
                   {"fraction", frac},
                   {"elapsed_s", elapsed()}});
    cfg = r.cfg;
    batches.set_size(size, engine->num_steps());
  };
  // The evaluation model (at --eval-size), weights mapped from the training model.
  std::unique_ptr<Engine> eval_engine;
  ModelConfig eval_cfg = final_cfg;
  eval_cfg.img_size = eval_size;
  auto run_eval = [&]() -> EvalResult {
    if (cfg.img_size == eval_size)
      return evaluate(*engine, *data.val, eval_bc, B, nullptr, args.workers, comm.get());
    if (!eval_engine) {
      EngineOptions o = engine_opt;
      o.cfg = eval_cfg;
      o.max_batch = B;
      o.max_img_size = eval_size;
      eval_engine = make_engine(o);
    }
    std::vector<float> p(size_t(eval_engine->table().total));
    map_buffer(cfg, engine->table(), engine->read_params().data(), eval_cfg, eval_engine->table(),
               p.data(), false);
    eval_engine->write_params(p);
    return evaluate(*eval_engine, *data.val, eval_bc, B, nullptr, args.workers, comm.get());
  };
  auto save_state = [&](int64_t epoch, int64_t update_in_epoch) {
    st.epoch = epoch;
    st.update_in_epoch = update_in_epoch;
    st.elapsed_s = elapsed();
    st.compute_consumed = compute.consumed;
    out.save_state(*engine, cfg, st);
  };

  const auto nonfinite_ranges = injected_nonfinite_updates();
  auto injected = [&](int64_t update) {
    for (auto [a, b] : nonfinite_ranges)
      if (update >= a && update <= b) return true;
    return false;
  };

  // Running estimates for the budget's stop rule.
  double step_est = 0, eval_est = -1;
  int64_t updates_since_eval = 0;
  bool evaluated_once = false;
  // Evaluates, logs, writes the weights; returns false when early stopping ends the run. With a
  // model EMA both are evaluated and, as in timm, the EMA's metric is the run's: it picks
  // model_best (which then holds the EMA weights) and fills summary.csv.
  auto eval_and_save = [&](int64_t epoch, double train_loss, double ips, double lr_now,
                           double frac) {
    const double t0 = elapsed();
    const EvalResult raw = run_eval();
    fmt::print("{}\n", format_eval_line(epoch, raw.loss, raw.top1, raw.top5));
    out.save_weights(
        "last.safetensors", *engine, cfg,
        {{"epoch", std::to_string(epoch)}, {"eval_top1", fmt::format("{:.4f}", raw.top1)}});
    EvalResult ev = raw;          // the run's metric
    if (ema) engine->swap_ema();  // the EMA weights in the model, until the swap back below
    if (ema) {
      ev = run_eval();
      fmt::print("{}\n", format_eval_line(epoch, ev.loss, ev.top1, ev.top5, "Test EMA"));
      out.save_weights("last_ema.safetensors", *engine, cfg,
                       {{"epoch", std::to_string(epoch)},
                        {"eval_top1", fmt::format("{:.4f}", ev.top1)},
                        {"weights", "ema"}});
    }
    const double budget_s = budget ? budget->total_s : 0.0;
    bool keep_going = true;
    if (ev.top1 > st.best_metric) {
      st.best_metric = ev.top1;
      st.best_epoch = epoch;
      st.bad_epochs = 0;
      Metadata meta = {{"epoch", std::to_string(epoch)},
                       {"eval_top1", fmt::format("{:.4f}", ev.top1)}};
      if (ema) meta["weights"] = "ema";
      out.save_weights("model_best.safetensors", *engine, cfg, meta);
    } else {
      ++st.bad_epochs;
    }
    if (ema) engine->swap_ema();
    if (args.patience > 0 && st.bad_epochs >= args.patience) {
      fmt::print("Early stopping: no top-1 improvement for {} evaluations\n", st.bad_epochs);
      keep_going = false;
    }
    const double dt = elapsed() - t0;
    eval_est = std::max(eval_est, dt);
    out.summary.append({epoch, train_loss, ev.loss, ev.top1, ev.top5, lr_now, cfg.img_size,
                        elapsed(), ips, budget_s, frac});
    nlohmann::json j = {
        {"type", "eval"},           {"epoch", epoch},         {"step", engine->num_steps()},
        {"eval_loss", ev.loss},     {"eval_top1", ev.top1},   {"eval_top5", ev.top5},
        {"img_size", cfg.img_size}, {"eval_size", eval_size}, {"budget_s", budget_s},
        {"fraction", frac},         {"elapsed_s", elapsed()}};
    if (data.streamed()) j["skipped_images"] = unreadable();  // unreadable files so far
    if (ema) {                                                // eval_* above are the EMA's
      j["ema"] = true;
      j["raw_eval_loss"] = raw.loss;
      j["raw_eval_top1"] = raw.top1;
      j["raw_eval_top5"] = raw.top5;
    }
    out.log.write(j);
    out.plot.eval_loss.push_back({elapsed(), ev.loss});
    out.plot.eval_top1.push_back({elapsed(), ev.top1});
    updates_since_eval = 0;
    evaluated_once = true;
    return keep_going;
  };

  bool stopped_early = false, finished = false;
  for (int64_t epoch = st.epoch; (open_ended || epoch < args.epochs) && !stopped_early && !finished;
       ++epoch) {
    const int64_t first_update = epoch == st.epoch ? st.update_in_epoch : 0;
    double loss_sum = 0, loss_avg_window = 0, data_window = 0, data_epoch = 0;
    int64_t loss_count = 0, window = 0, window_losses = 0, samples = 0;
    double loss = 0, gnorm = 0;  // of the last update read
    // Reads the losses of the updates since the last read. Updates with a non-finite loss or
    // grad norm were skipped by the engine: counted, reported, and max_bad_steps of them in a
    // row end the run without writing anything (the last checkpoint stays as it was).
    auto take_stats = [&](int64_t ep, int64_t update) {
      const TrainStats ts = engine->read_stats();
      if (ts.updates == 0) return;
      loss_sum += ts.loss_sum;
      loss_count += ts.applied();
      loss_avg_window += ts.loss_sum;
      window_losses += ts.applied();
      loss = ts.last_loss;
      gnorm = ts.grad_norm;
      if (ts.skipped == 0) return;
      st.skipped_steps += ts.skipped;
      if (std::max(ts.bad_run, ts.bad_run_max) >= args.max_bad_steps)
        throw Error(fmt::format(
            "{} updates in a row had a non-finite loss or gradient norm (the last at epoch {} "
            "update {}): training diverged; stopped without writing, {}",
            std::max(ts.bad_run, ts.bad_run_max), ep, update,
            fs::exists(fs::path(run_dir) / "state.safetensors")
                ? "the last checkpoint in " + run_dir +
                      " is intact (resume it with a lower --lr or with --clip-grad)"
                : std::string("no checkpoint had been written yet (try a lower --lr or "
                              "--clip-grad)")));
      fmt::print(
          "{}warning: {} update{} skipped for a non-finite loss or gradient norm (up to "
          "epoch {} update {}; {} in this run, {} in a row stop it)\n",
          tty ? "\n" : "", ts.skipped, ts.skipped == 1 ? "" : "s", ep, update, st.skipped_steps,
          args.max_bad_steps);
      out.log.write({{"type", "skip"},
                     {"epoch", ep},
                     {"update", update},
                     {"step", engine->num_steps()},
                     {"skipped", ts.skipped},
                     {"skipped_steps", st.skipped_steps},
                     {"elapsed_s", elapsed()}});
    };
    auto t_window = std::chrono::steady_clock::now();
    const double t_epoch0 = elapsed();
    int64_t u = first_update;
    for (; u < upe; ++u) {
      // Stop rules of the open-ended runs: compute spent, or no time left for a step + final eval.
      if (et && !budget && compute.done()) {
        finished = true;
        break;
      }
      if (budget) {
        const double ev_guess = eval_est >= 0
                                    ? eval_est
                                    // forward only is about a third of a training step per image
                                    : step_est * double(n_val) / double(cap * accum) / 3.0 *
                                              std::pow(double(eval_size) / cfg.img_size, 2) +
                                          0.5;
        if (budget->should_stop(elapsed(), step_est, ev_guess)) {
          finished = true;
          break;
        }
      }
      const auto t_step = std::chrono::steady_clock::now();
      const double frac = fraction(epoch, u);
      set_train_size(plan.target_size(args, epoch, frac), epoch, u, frac);
      const int S = cfg.img_size;
      const double lr = plan.lr_at(args, engine->num_steps(), frac);
      if (et) batches.set_magnitude(et_magnitude(frac));
      engine->zero_grad();
      Index step_samples = 0;
      for (Index a = 0; a < accum; ++a) {
        const Index mb = u * accum + a;  // micro-batch index in the epoch
        double dt_data = 0;
        const Index n = batches.load(epoch, mb, &dt_data);
        data_window += dt_data;
        data_epoch += dt_data;
        const bool inject = injected(engine->num_steps() + 1);
        engine->forward_backward(batches.images(), batches.targets(), n,
                                 inject ? std::nanf("") : 1.0f / float(n * accum * world),
                                 mix_seed(args.seed, uint64_t(engine->num_steps()), uint64_t(a)));
        step_samples += n * world;  // the global batch
      }
      engine->step(lr);
      if (ema)
        engine->update_ema(
            ema_decay(engine->num_steps(), args.model_ema_decay, args.model_ema_warmup));
      compute.add(int64_t(step_samples), S);
      samples += step_samples;
      ++updates_since_eval;
      const double dt_step =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
      step_est = step_est == 0 ? dt_step : std::max(dt_step, 0.9 * step_est + 0.1 * dt_step);
      ++window;
      const bool last = u + 1 == upe;
      const bool log_now = (u + 1) % args.log_interval == 0 || last;
      // The losses stay on the device between log points (no host sync per step on the GPU).
      if (read_every_step || log_now) take_stats(epoch, u + 1);
      if (log_now) {
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_window).count();
        const double ips = double(window * step_samples) / std::max(dt, 1e-9);
        const double f_now = fraction(epoch, u + 1);
        double eta;
        if (open_ended)
          eta = f_now > 0 ? (elapsed() - elapsed_before) * (1 - f_now) / f_now : 0.0;
        else {
          const double remaining_updates =
              double(upe - u - 1) + double(upe) * (args.epochs - epoch - 1);
          eta = remaining_updates * dt / std::max<int64_t>(window, 1);
        }
        TrainLine line{epoch,       u + 1, upe, loss, mean_or_nan(loss_sum, loss_count),
                       dt / window, ips,   lr,  eta};
        if (data.streamed()) {  // time spent waiting for batches, per update
          line.data_s = data_window / window;
          line.data_s_avg = data_epoch / loss_count;
        }
        const GpuStats gpu = gpu_monitor ? gpu_monitor->read() : GpuStats{};
        std::string text = format_train_line(line);
        if (!gpu.empty()) text += "  " + format_gpu_stats(gpu);
        if (tty)
          fmt::print("\r{}\033[K", text);
        else
          fmt::print("{}\n", text);
        std::fflush(stdout);
        nlohmann::json j = {{"type", "train"},
                            {"epoch", epoch},
                            {"update", u + 1},
                            {"step", engine->num_steps()},
                            {"loss", loss},
                            {"loss_avg", mean_or_nan(loss_sum, loss_count)},
                            {"loss_window", mean_or_nan(loss_avg_window, window_losses)},
                            {"lr", lr},
                            {"grad_norm", gnorm},
                            {"img_per_s", ips},
                            {"gflops", ips * flops_per_img * et_compute_weight(S, F) / 1e9},
                            {"elapsed_s", elapsed()},
                            {"img_size", S},
                            {"fraction", f_now}};
        if (budget) j["budget_s"] = budget->total_s;
        if (st.skipped_steps > 0) j["skipped_steps"] = st.skipped_steps;
        add_gpu_stats(j, gpu);
        if (engine->on_gpu())
          j["device_mem_peak_gib"] = engine->device_memory_bytes() / 1073741824.0;
        if (et) {
          j["stage"] = et_stage(frac);
          j["magnitude"] = et_magnitude(frac);
          j["progress"] = compute.progress();
        }
        out.log.write(j);
        if (window_losses > 0)
          out.plot.train_loss.push_back({elapsed(), loss_avg_window / window_losses});
        out.plot.lr.push_back({elapsed(), lr});
        loss_avg_window = 0;
        window_losses = 0;
        data_window = 0;
        window = 0;
        t_window = std::chrono::steady_clock::now();
      }
      const bool stop_test =
          args.stop_after_updates > 0 && engine->num_steps() >= args.stop_after_updates;
      if (g_stop_requested || stop_test) {
        if (tty) fmt::print("\n");
        save_state(epoch, u + 1);
        fmt::print(
            "Stopped at epoch {} update {}; state saved. Continue with: vitrain train "
            "--resume {}\n",
            epoch, u + 1, run_dir);
        return stop_test ? 0 : 130;
      }
    }
    if (tty) fmt::print("\n");
    take_stats(epoch, u);  // updates not yet read (a budget stop between log points)
    const double train_seconds = elapsed() - t_epoch0;
    if (Profile::enabled()) {  // VIT_PROFILE=1: where this epoch's time went, per update
      Profile::print(stdout, int(std::max<int64_t>(1, u - first_update)));
      Profile::reset();
    }
    const double train_loss = loss_count ? loss_sum / loss_count : 0.0;
    const double ips = double(samples) / std::max(train_seconds, 1e-9);
    const double frac_now = fraction(epoch, u);
    auto lr_now = [&] {
      return plan.lr_at(args, engine->num_steps(), et ? std::min(1.0, frac_now) : frac_now);
    };

    if (finished) {  // the compute or time budget is spent: final evaluation at the final size
      if (updates_since_eval > 0 || !evaluated_once)
        eval_and_save(epoch, train_loss, ips, lr_now(), frac_now);
      save_state(epoch, u);
      out.write_plot();
      if (budget)
        fmt::print("Budget: stopped after {:.1f}s of {:.1f}s ({:.1f}% used), {} updates\n",
                   elapsed(), budget->total_s, 100.0 * elapsed() / budget->total_s,
                   engine->num_steps());
      else
        fmt::print("Compute budget spent: {:.0f} final-size images, {} updates\n", compute.consumed,
                   engine->num_steps());
      break;
    }
    const bool do_eval =
        (epoch + 1) % args.eval_interval == 0 || (!open_ended && epoch + 1 == args.epochs);
    if (!do_eval) {
      save_state(epoch + 1, 0);
      continue;
    }
    if (!eval_and_save(epoch, train_loss, ips, lr_now(), frac_now)) stopped_early = true;
    save_state(stopped_early ? (open_ended ? epoch + 1 : args.epochs) : epoch + 1, 0);
    out.write_plot();
  }
  fmt::print("*** Best metric: {:.3f} (epoch {})\n", st.best_metric, st.best_epoch);
  if (data.streamed()) fmt::print("Skipped {} unreadable images\n", unreadable());
  const auto& rows = out.summary.rows();
  if (!rows.empty())
    fmt::print("Final test top-1: {:.2f}%  top-5: {:.2f}%  loss: {:.4f}  ({} of training{})\n",
               rows.back().eval_top1, rows.back().eval_top5, rows.back().eval_loss,
               format_duration(elapsed()),
               data.streamed() ? fmt::format(", {} unreadable images skipped", unreadable())
                               : std::string());
  if (engine->on_gpu())
    fmt::print("Peak device memory: {:.2f} GiB (model, activations, optimizer)\n",
               engine->device_memory_bytes() / 1073741824.0);
  fmt::print("Run folder: {}\n", run_dir);
  return 0;
}

}  // namespace vit
