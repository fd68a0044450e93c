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
#include <utility>

#include "core/gpu_stats.h"
#include "core/profile.h"
#include "core/rng.h"
#include "core/warning.h"
#include "data/augment.h"
#include "data/batch.h"
#include "data/dataset.h"
#include "data/image_folder.h"
#include "data/loader.h"
#include "data/source.h"
#include "dist/comm.h"
#include "io/atomic_file.h"
#include "io/plot.h"
#include "ops/kernel_options.h"
#include "train/batch_config.h"
#include "train/budget.h"
#include "train/checkpoint.h"
#include "train/curriculum.h"
#include "train/engine.h"
#include "train/eval_probe.h"
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

// The image sizes a run trains and evaluates at: each size a curriculum passes, the current
// and the final size (the kernel plan covers their shapes).
std::vector<int> run_image_sizes(const RunPlan& plan, int current) {
  std::vector<int> sizes = {current, plan.final_size, plan.eval_size};
  if (plan.efficienttrain) sizes.insert(sizes.end(), plan.et.sizes.begin(), plan.et.sizes.end());
  if (plan.size_curriculum && plan.size_step > 0)
    for (int s = plan.init_size; s < plan.final_size; s += plan.size_step) sizes.push_back(s);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

// A resumed run's kernels.json; null (plan afresh, said once) when the run folder has none.
nlohmann::json recorded_kernel_plan(const std::string& run_dir) {
  const std::string path = run_dir + "/kernels.json";
  if (!fs::exists(path)) {
    fmt::print("Kernels: {} has no kernels.json; the plan is made afresh\n", run_dir);
    return nullptr;
  }
  try {
    return nlohmann::json::parse(io::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("--resume: {} is not valid JSON ({})", path, e.what()));
  }
}

std::string state_path_of(const std::string& resume) {
  const std::string p = fs::is_directory(resume) ? resume + "/state.safetensors" : resume;
  if (!fs::is_regular_file(p)) throw Error(fmt::format("--resume: no training state at '{}'", p));
  return p;
}

// Data parallelism (mpirun) needs the global batch to split evenly over the ranks. A
// wall-clock budget runs on rank 0's clock (TrainRun::agree); the replay buffer is each
// rank's own, over its share of each batch (TrainBatches::make_replay).
void check_data_parallel(const RunPlan& plan, int world) {
  if (world == 1) return;
  VIT_CHECK(plan.batch % world == 0 && plan.max_samples % world == 0,
            fmt::format("data parallel: the batch size {} must be a multiple of the {} ranks",
                        plan.batch, world));
}

// For the tests: VIT_TEST_FAIL_AT="1:5" makes rank 1 fail with a vit::Error at its 5th update
// (what a rank that hits bad data or a full disk alone does to the job). {-1, 0} when unset.
std::pair<int, int64_t> test_failure_point() {
  const char* env = std::getenv("VIT_TEST_FAIL_AT");
  int rank = -1;
  long long update = 0;
  if (env && std::sscanf(env, "%d:%lld", &rank, &update) != 2)
    throw Error(fmt::format("VIT_TEST_FAIL_AT: expected RANK:UPDATE, got '{}'", env));
  return {rank, int64_t(update)};
}

// For the tests: VIT_TEST_CLOCK_SKEW_S="100" sets the clocks of ranks other than 0 ahead by
// that many seconds (a data-parallel budget must follow rank 0's).
double test_clock_skew(int rank) {
  const char* env = std::getenv("VIT_TEST_CLOCK_SKEW_S");
  return env && rank != 0 ? std::strtod(env, nullptr) : 0.0;
}

std::string format_duration(double s) {
  const long t = long(std::max(0.0, s));
  return fmt::format("{}:{:02d}:{:02d}", t / 3600, int(t / 60 % 60), int(t % 60));
}

// One training run: the setup (communicator, data, plan, engine, outputs), the epoch loop and
// its pieces, the summary. The members are the run's state; each method is one step of it.
class TrainRun {
 public:
  TrainRun(const TrainArgs& args, const std::string& args_yaml);
  int run();

 private:
  // What one epoch accumulates between its log points and for its summary.
  struct EpochTally {
    double loss_sum = 0, loss_avg_window = 0, data_window = 0, data_epoch = 0;
    int64_t loss_count = 0, window = 0, window_losses = 0, samples = 0;
    double loss = 0, gnorm = 0;  // of the last update read
    std::chrono::steady_clock::time_point t_window = std::chrono::steady_clock::now();
  };
  enum class EpochEnd { Done, BudgetSpent, StoppedEarly, Interrupted };

  void open_run_dir();
  void start_weights();
  void print_header() const;
  void warn_if_ema_lags(int64_t updates, const char* when) const;
  EpochEnd run_epoch(int64_t epoch);
  void agree(bool epoch_end = false);
  bool budget_spent() const;
  bool stop_requested() const;
  bool time_is_up(int64_t updates);
  FinalEvalShape final_eval_shape() const;
  void probe_eval();
  double budget_clock() const;
  Index train_update(int64_t epoch, int64_t u, EpochTally& t);
  void log_progress(int64_t epoch, int64_t u, double frac, double lr, Index step_samples,
                    EpochTally& t);
  void take_stats(int64_t epoch, int64_t update, EpochTally& t);
  EpochEnd end_epoch(int64_t epoch, int64_t u, int64_t first_update, bool budget_spent,
                     const EpochTally& t, double t_epoch0);
  void set_train_size(int size, int64_t epoch, int64_t update, double frac);
  Engine& eval_model();
  EvalResult run_eval();
  bool eval_and_save(int64_t epoch, double train_loss, double ips, double lr_now, double frac);
  bool record_best(int64_t epoch, const EvalResult& ev);
  void log_eval(int64_t epoch, const EvalResult& raw, const EvalResult& ev, double train_loss,
                double ips, double lr_now, double frac);
  void save_state(int64_t epoch, int64_t update_in_epoch);
  void print_summary() const;
  double elapsed() const;
  double fraction(int64_t epoch, int64_t update) const;
  bool injected(int64_t update) const;
  size_t unreadable() const {
    return data_.train->unreadable_count() + data_.val->unreadable_count();
  }

  const TrainArgs& args_;
  const std::string device_;
  std::shared_ptr<Comm> comm_;
  int rank_ = 0, world_ = 1;
  data::DataSplits data_;
  RunPlan plan_;
  Index B_ = 0, accum_ = 1, upe_ = 0, cap_ = 0;  // B_, cap_: this rank's samples per pass
  int F_ = 0, eval_size_ = 0;
  bool et_ = false, open_ended_ = false;
  std::optional<TrainState> resumed_;
  std::string run_dir_;
  ModelConfig cfg_;  // the current training size
  EngineOptions engine_opt_;
  std::unique_ptr<Engine> engine_;
  TrainState st_;
  std::optional<RunOutputs> out_;
  ComputeBudget compute_;
  data::BatchConfig eval_bc_;
  double flops_per_img_ = 0;
  bool tty_ = false, read_every_step_ = true;
  std::unique_ptr<GpuMonitor> gpu_monitor_;
  std::optional<TrainBatches> batches_;
  double elapsed_before_ = 0;
  std::chrono::steady_clock::time_point t_start_;
  std::unique_ptr<Engine> eval_engine_;  // at --eval-size, when it differs from the training size
  std::vector<std::pair<int64_t, int64_t>> nonfinite_ranges_;
  // The budget's stop rule (rank 0's decides) and its last verdict; step_est_ paces the
  // data-parallel checks.
  std::optional<BudgetPlanner> planner_;
  BudgetVerdict verdict_;
  double progress_ = 0;  // the budget's schedule progress at the last update (budget_progress)
  double step_est_ = 0;
  // What the last agree() settled, on every rank alike.
  struct Agreement {
    double clock = 0;          // the budget's elapsed seconds then
    double step_s = 0;         // the step time the clock extrapolates with until the next one
    int64_t at = 0;            // the update count then
    int64_t next = 0;          // the update count of the next one (data parallel)
    double final_s = 0;        // the time the budget keeps for the final evaluation
    bool interim_eval = true;  // an epoch's evaluation now leaves time for the final one
    bool time_up = false;      // the budget's verdict
    bool stop = false;         // rank 0's stop request (data parallel)
  } agreed_;
  double clock_skew_ = 0;                   // VIT_TEST_CLOCK_SKEW_S on ranks other than 0
  std::pair<int, int64_t> fail_at_{-1, 0};  // VIT_TEST_FAIL_AT
  int64_t updates_since_eval_ = 0;
  bool evaluated_once_ = false;
  int exit_code_ = 0;  // of an interrupted run
};

TrainRun::TrainRun(const TrainArgs& args, const std::string& args_yaml)
    : args_(args), device_(resolve_device(args.device)) {  // before any work: a clear error
  if (args.workers > 0) omp_set_num_threads(args.workers);
  // Data parallel (mpirun; torchrun / srun on GPUs): rank 0 prints, logs and writes; the
  // others compute.
  VIT_CHECK(args.dist_timeout >= 0, "--dist-timeout must be >= 0 seconds");
  comm_ = make_run_comm(device_, args.dist_timeout);
  rank_ = comm_->rank();
  world_ = comm_->size();
  comm_->set_timeout(args.dist_timeout);
  clock_skew_ = test_clock_skew(rank_);
  fail_at_ = test_failure_point();
  if (rank_ > 0 && !std::freopen("/dev/null", "w", stdout))
    throw Error("cannot silence stdout on a worker rank");

  data_ = data::load_data_dir(args.data_dir, args.class_map.empty()
                                                 ? std::vector<std::string>{}
                                                 : data::read_class_map(args.class_map));
  VIT_CHECK(args.class_map.empty() || data_.streamed(),
            fmt::format("--class-map applies to ImageFolder and packed data, not to the {} data "
                        "in '{}'",
                        data_.format, args.data_dir));
  plan_ = plan_run(args, data_);
  F_ = plan_.final_size;
  check_data_parallel(plan_, world_);
  B_ = plan_.batch / world_;
  accum_ = plan_.accum;
  upe_ = plan_.updates_per_epoch;
  et_ = plan_.efficienttrain;
  open_ended_ = plan_.open_ended();
  eval_size_ = plan_.eval_size;
  cap_ = plan_.max_samples / world_;  // samples per forward pass with replay

  cfg_ = plan_.final_cfg;
  open_run_dir();
  // A worker rank's stdout (its copy of the progress lines, NCCL's warnings) goes to its own
  // log in the run folder: rank 0's console stays one rank's, and nothing a rank says is lost.
  if (rank_ > 0 &&
      !std::freopen((fs::path(run_dir_) / fmt::format("rank{}.log", rank_)).c_str(), "a", stdout))
    throw Error(fmt::format("cannot open rank{}.log in the run folder {}", rank_, run_dir_));
  if (rank_ > 0) set_warning_log(stdout);  // and its warnings, besides stderr
  start_weights();
  st_.args_yaml = args_yaml;
  // What eval/export need to reproduce the input pipeline and name the classes.
  const Metadata data_meta = {{"mean", nlohmann::json(data_.mean).dump()},
                              {"std", nlohmann::json(data_.std).dump()},
                              {"label_names", nlohmann::json(data_.train->class_names()).dump()}};
  // summary.csv keeps the rows of the epochs before the one the run continues in, and that
  // epoch's too when it ended in the (final) evaluation of these very weights (a spent budget).
  const int64_t kept_epochs =
      st_.updates_since_eval == 0 && st_.update_in_epoch > 0 ? st_.epoch + 1 : st_.epoch;
  out_.emplace(rank_ == 0 ? run_dir_ : std::string(), plan_.final_cfg, data_meta, kept_epochs,
               st_.step, fmt::format("{} on {}", plan_.final_cfg.name, args.data_dir));
  out_->write_run_files(st_.args_yaml, data_.train->class_names());
  out_->write_kernel_plan(*engine_);
  const nlohmann::ordered_json kernels = engine_->kernel_plan();
  out_->log.write({{"type", "kernels"},
                   {"file", "kernels.json"},
                   {"options", kernels.at("options")},
                   {"device", kernels.at("device")}});
  compute_ = ComputeBudget(double(args.epochs), int64_t(data_.train->size()), F_);
  compute_.consumed = st_.compute_consumed;
  // Streamed data (photos of any size) is evaluated as timm does: resize + centre crop.
  eval_bc_ = eval_batch_config(args, eval_size_, data_.mean, data_.std, data_.streamed());
  flops_per_img_ = 3.0 * plan_.final_cfg.forward_flops_per_image();
  print_header();

  g_stop_requested = false;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  tty_ = stdout_is_tty();
  // On the host reading the loss is free: check every update. On the GPU only at log points.
  read_every_step_ = !engine_->on_gpu();
  // GPU utilisation, memory, power and clock in the log (NVML, when the driver has it).
  if (engine_->on_gpu()) gpu_monitor_ = std::make_unique<GpuMonitor>();
  batches_.emplace(args, plan_, data_, cfg_.img_size, engine_->num_steps(), rank_, world_);
  if (batches_->workers() > 0) {
    fmt::print("Data: {} ({}), {} loader workers\n", data_.format, args.data_dir,
               batches_->workers());
    std::fflush(stdout);
  }
  nonfinite_ranges_ = injected_nonfinite_updates();
  elapsed_before_ = st_.elapsed_s;
  if (st_.updates_since_eval >= 0) {  // a resumed run knows whether its weights were evaluated
    updates_since_eval_ = st_.updates_since_eval;
    evaluated_once_ = st_.best_epoch >= 0;
  }
  t_start_ = std::chrono::steady_clock::now();
  if (plan_.budget)
    planner_.emplace(*plan_.budget, final_eval_shape(), [this] { return elapsed(); });
}

// --resume: the state's folder and training size; else a new run folder (rank 0 names it).
void TrainRun::open_run_dir() {
  if (!args_.resume.empty()) {
    const std::string sp = state_path_of(args_.resume);
    resumed_ = load_train_state(sp);
    run_dir_ = fs::path(sp).parent_path().string();
    cfg_.img_size = resumed_->weights.cfg.img_size;  // the state is at its training size
    VIT_CHECK(model_config_to_json(resumed_->weights.cfg) == model_config_to_json(cfg_),
              fmt::format("--resume: the state in '{}' is for a different model than the "
                          "flags describe",
                          sp));
    return;
  }
  if (rank_ == 0)
    run_dir_ = make_run_dir(args_.output, args_.experiment, plan_.final_cfg.name,
                            plan_.final_cfg.img_size);
  run_dir_ = broadcast_string(*comm_, run_dir_, 0);
}

// The engine, and its weights: the resumed state's, or fresh ones (or --initial-checkpoint's).
void TrainRun::start_weights() {
  engine_opt_.device = device_;
  engine_opt_.precision = args_.precision;
  engine_opt_.fp32_residual = args_.fp32_residual;
  engine_opt_.cuda_graph = args_.cuda_graph;
  engine_opt_.cfg = cfg_;
  engine_opt_.max_batch = cap_;
  // Curricula never exceed the final size.
  engine_opt_.max_img_size = std::max(F_, cfg_.img_size);
  engine_opt_.adamw = AdamWConfig{0.9, 0.999, 1e-8, args_.weight_decay, args_.clip_grad};
  engine_opt_.ema = args_.model_ema;
  engine_opt_.comm = comm_;
  engine_opt_.shard_optimizer = args_.shard_optimizer;
  engine_opt_.micro_batches = int(accum_);  // every update has accum_ micro-batches
  engine_opt_.kernels = parse_kernel_options(args_.kernels);
  engine_opt_.plan_sizes = run_image_sizes(plan_, cfg_.img_size);
  if (resumed_) engine_opt_.recorded_kernels = recorded_kernel_plan(run_dir_);
  engine_ = make_engine(engine_opt_);
  if (resumed_) {
    st_ = std::move(*resumed_);
    engine_->write_params(st_.weights.params);
    engine_->write_moments(st_.exp_avg, st_.exp_avg_sq, st_.step);
    if (args_.model_ema) {
      if (st_.ema.empty())
        fmt::print("Model EMA: the state has none; it starts from the resumed weights\n");
      engine_->write_ema(st_.ema.empty() ? st_.weights.params : st_.ema);
    }
    return;
  }
  std::vector<float> p(size_t(engine_->table().total), 0.0f);
  init_params(p.data(), engine_->table(), cfg_, args_.seed);
  if (!args_.initial_checkpoint.empty())
    load_initial_checkpoint(args_.initial_checkpoint, cfg_, engine_->table(), p.data(), stdout);
  engine_->write_params(p);
  if (args_.model_ema) engine_->write_ema(p);  // timm copies the model at the start
}

void TrainRun::print_header() const {
  const ModelConfig& final_cfg = plan_.final_cfg;
  fmt::print(
      "Model {} ({} params, {:.1f} MFLOP/img train), data {} ({} train / {} eval, {} "
      "classes), {} updates/epoch, batch {} x {}, lr {:.3g}, run {}\n",
      final_cfg.name, engine_->table().num_params, flops_per_img_ / 1e6, args_.data_dir,
      data_.train->size(), data_.val->size(), cfg_.num_classes, upe_, B_, accum_, args_.lr,
      run_dir_);
  fmt::print("Device: {}\n", engine_->description());
  fmt::print("{}\n", format_state_memory(engine_->state_memory(), engine_->on_gpu(),
                                         args_.shard_optimizer ? world_ : 1));
  if (world_ > 1)
    fmt::print("Data parallel: {} ranks ({}), {} samples per rank per micro-batch{}\n", world_,
               comm_->name(), B_, args_.shard_optimizer ? ", sharded optimizer (ZeRO-1)" : "");
  const std::optional<TimeBudget>& budget = plan_.budget;
  if (args_.curriculum != "none" || budget || plan_.replay > 1)
    fmt::print("Seed methods: curriculum {}{}, final size {}, eval size {}, budget {}, replay {}\n",
               args_.curriculum,
               et_ ? fmt::format(" (lowfreq {}, sizes {}, warm-up {:.3g})", args_.lowfreq,
                                 fmt::join(plan_.et.sizes, "/"), args_.et_warmup)
                   : std::string(),
               F_, eval_size_, budget ? fmt::format("{:.0f}s", budget->total_s) : "none",
               plan_.replay);
  if (resumed_)
    fmt::print("Resumed at epoch {} update {} (step {}), training size {}\n", st_.epoch,
               st_.update_in_epoch, st_.step, cfg_.img_size);
  if (!open_ended_) warn_if_ema_lags(upe_ * args_.epochs, "will have");
  std::fflush(stdout);
}

// A model EMA that is still mostly the first update's weights at the end of the run reports
// (as the run's result, timm's convention) an accuracy near those weights': say so, once the
// number of updates is known.
void TrainRun::warn_if_ema_lags(int64_t updates, const char* when) const {
  if (!args_.model_ema || rank_ != 0) return;
  const double share = ema_first_share(updates, args_.model_ema_decay, args_.model_ema_warmup);
  if (share <= 0.5) return;
  std::fflush(stdout);  // after the lines before it, also when both go to one pipe
  fmt::print(stderr,
             "warning: the model EMA (decay {}{}) {} {} updates, so it is still {:.0f}% the "
             "weights of the first one and its evaluation, the run's result, shows those; "
             "{} suits a run this short\n",
             args_.model_ema_decay, args_.model_ema_warmup ? ", warm-up" : "", when, updates,
             100.0 * share,
             args_.model_ema_warmup ? "a lower --model-ema-decay"
                                    : "--model-ema-warmup (or a lower --model-ema-decay)");
}

double TrainRun::elapsed() const {
  return elapsed_before_ + clock_skew_ +
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start_).count();
}

// Fraction of the schedule done: the time budget, else ET++'s compute, else epochs.
double TrainRun::fraction(int64_t epoch, int64_t update) const {
  if (plan_.budget) return progress_;
  if (et_) return compute_.progress();
  return std::min(1.0, (double(epoch) + double(update) / double(upe_)) / double(args_.epochs));
}

bool TrainRun::injected(int64_t update) const {
  for (auto [a, b] : nonfinite_ranges_)
    if (update >= a && update <= b) return true;
  return false;
}

// Moves the model and its AdamW moments to another training size (pos_embed resampled).
void TrainRun::set_train_size(int size, int64_t epoch, int64_t update, double frac) {
  if (size == cfg_.img_size) return;
  std::vector<float> m, v;
  engine_->read_moments(m, v);
  ResizedBuffers r = resize_model(cfg_, engine_->table(), engine_->read_params(), m, v, size);
  std::vector<float> ema_resized;
  if (args_.model_ema) {  // the EMA follows the weights (pos_embed resampled the same way)
    ema_resized.resize(size_t(r.table.total));
    map_buffer(cfg_, engine_->table(), engine_->read_ema().data(), r.cfg, r.table,
               ema_resized.data(), false);
  }
  engine_->set_img_size(size);  // same buffers, new table
  engine_->write_params(r.params);
  engine_->write_moments(r.m, r.v, engine_->num_steps());
  if (args_.model_ema) engine_->write_ema(ema_resized);
  fmt::print("{}Size: {} -> {} px at epoch {} update {} (progress {:.3f}{})\n", tty_ ? "\n" : "",
             cfg_.img_size, size, epoch, update, frac,
             et_ ? fmt::format(", stage {}, magnitude {}", et_stage(frac), et_magnitude(frac))
                 : std::string());
  std::fflush(stdout);
  out_->log.write({{"type", "size"},
                   {"epoch", epoch},
                   {"update", update},
                   {"step", engine_->num_steps()},
                   {"from", cfg_.img_size},
                   {"img_size", size},
                   {"fraction", frac},
                   {"elapsed_s", elapsed()}});
  out_->plot.marks.push_back({elapsed(), size_mark_label(size)});
  cfg_ = r.cfg;
  batches_->set_size(size, engine_->num_steps());
}

// The model that evaluates: the training model, or one at --eval-size with the weights mapped.
Engine& TrainRun::eval_model() {
  if (cfg_.img_size == eval_size_) return *engine_;
  ModelConfig eval_cfg = plan_.final_cfg;
  eval_cfg.img_size = eval_size_;
  if (!eval_engine_) {
    EngineOptions o = engine_opt_;
    o.cfg = eval_cfg;
    o.max_batch = B_;
    o.max_img_size = eval_size_;
    eval_engine_ = make_engine(o);
  }
  std::vector<float> p(size_t(eval_engine_->table().total));
  map_buffer(cfg_, engine_->table(), engine_->read_params().data(), eval_cfg, eval_engine_->table(),
             p.data(), false);
  eval_engine_->write_params(p);
  return *eval_engine_;
}

EvalResult TrainRun::run_eval() {
  return evaluate(eval_model(), *data_.val, eval_bc_, B_, nullptr, args_.workers, comm_.get());
}

void TrainRun::save_state(int64_t epoch, int64_t update_in_epoch) {
  st_.epoch = epoch;
  st_.update_in_epoch = update_in_epoch;
  st_.elapsed_s = elapsed();
  st_.compute_consumed = compute_.consumed;
  st_.updates_since_eval = updates_since_eval_;
  out_->save_state(*engine_, cfg_, st_);
}

// Evaluates, logs, writes the weights; returns false when early stopping ends the run. With a
// model EMA both are evaluated and, as in timm, the EMA's metric is the run's: it picks
// model_best (which then holds the EMA weights) and fills summary.csv.
bool TrainRun::eval_and_save(int64_t epoch, double train_loss, double ips, double lr_now,
                             double frac) {
  const bool ema = args_.model_ema;
  const EvalResult raw = run_eval();
  fmt::print("{}\n", format_eval_line(epoch, raw.loss, raw.top1, raw.top5));
  out_->save_weights(
      "last.safetensors", *engine_, cfg_,
      {{"epoch", std::to_string(epoch)}, {"eval_top1", fmt::format("{:.4f}", raw.top1)}});
  EvalResult ev = raw;  // the run's metric
  if (ema) {
    engine_->swap_ema();  // the EMA weights in the model, until the swap back below
    ev = run_eval();
    fmt::print("{}\n", format_eval_line(epoch, ev.loss, ev.top1, ev.top5, "Test EMA"));
    out_->save_weights("last_ema.safetensors", *engine_, cfg_,
                       {{"epoch", std::to_string(epoch)},
                        {"eval_top1", fmt::format("{:.4f}", ev.top1)},
                        {"weights", "ema"}});
  }
  const bool keep_going = record_best(epoch, ev);
  if (ema) engine_->swap_ema();
  log_eval(epoch, raw, ev, train_loss, ips, lr_now, frac);
  updates_since_eval_ = 0;
  evaluated_once_ = true;
  return keep_going;
}

// A new best metric writes model_best (the weights in the model now: the EMA's, with one);
// returns false when --patience evaluations without improvement end the run.
bool TrainRun::record_best(int64_t epoch, const EvalResult& ev) {
  if (ev.top1 > st_.best_metric) {
    st_.best_metric = ev.top1;
    st_.best_epoch = epoch;
    st_.bad_epochs = 0;
    Metadata meta = {{"epoch", std::to_string(epoch)},
                     {"eval_top1", fmt::format("{:.4f}", ev.top1)}};
    if (args_.model_ema) meta["weights"] = "ema";
    out_->save_weights("model_best.safetensors", *engine_, cfg_, meta);
  } else {
    ++st_.bad_epochs;
  }
  if (args_.patience > 0 && st_.bad_epochs >= args_.patience) {
    fmt::print("Early stopping: no top-1 improvement for {} evaluations\n", st_.bad_epochs);
    return false;
  }
  return true;
}

// summary.csv, log.jsonl and the plot's curves for one evaluation.
void TrainRun::log_eval(int64_t epoch, const EvalResult& raw, const EvalResult& ev,
                        double train_loss, double ips, double lr_now, double frac) {
  const double budget_s = plan_.budget ? plan_.budget->total_s : 0.0;
  out_->summary.append({epoch, train_loss, ev.loss, ev.top1, ev.top5, lr_now, cfg_.img_size,
                        elapsed(), ips, budget_s, frac});
  nlohmann::json j = {{"type", "eval"},
                      {"epoch", epoch},
                      {"step", engine_->num_steps()},
                      {"eval_loss", ev.loss},
                      {"eval_top1", ev.top1},
                      {"eval_top5", ev.top5},
                      {"img_size", cfg_.img_size},
                      {"eval_size", eval_size_},
                      {"budget_s", budget_s},
                      {"fraction", frac},
                      {"elapsed_s", elapsed()}};
  if (data_.streamed()) j["skipped_images"] = unreadable();  // unreadable files so far
  if (args_.model_ema) {                                     // eval_* above are the EMA's
    j["ema"] = true;
    j["raw_eval_loss"] = raw.loss;
    j["raw_eval_top1"] = raw.top1;
    j["raw_eval_top5"] = raw.top5;
  }
  out_->log.write(j);
  out_->plot.eval_loss.push_back({elapsed(), ev.loss});
  out_->plot.eval_top1.push_back({elapsed(), ev.top1});
}

// Reads the losses of the updates since the last read. Updates with a non-finite loss or grad
// norm were skipped by the engine: counted, reported, and max_bad_steps of them in a row end
// the run without writing anything (the last checkpoint stays as it was).
void TrainRun::take_stats(int64_t ep, int64_t update, EpochTally& t) {
  const TrainStats ts = engine_->read_stats();
  if (ts.updates == 0) return;
  t.loss_sum += ts.loss_sum;
  t.loss_count += ts.applied();
  t.loss_avg_window += ts.loss_sum;
  t.window_losses += ts.applied();
  t.loss = ts.last_loss;
  t.gnorm = ts.grad_norm;
  if (ts.skipped == 0) return;
  st_.skipped_steps += ts.skipped;
  if (std::max(ts.bad_run, ts.bad_run_max) >= args_.max_bad_steps)
    throw Error(fmt::format(
        "{} updates in a row had a non-finite loss or gradient norm (the last at epoch {} "
        "update {}): training diverged; stopped without writing, {}",
        std::max(ts.bad_run, ts.bad_run_max), ep, update,
        fs::exists(fs::path(run_dir_) / "state.safetensors")
            ? "the last checkpoint in " + run_dir_ +
                  " is intact (resume it with a lower --lr or with --clip-grad)"
            : std::string("no checkpoint had been written yet (try a lower --lr or "
                          "--clip-grad)")));
  fmt::print(
      "{}warning: {} update{} skipped for a non-finite loss or gradient norm (up to "
      "epoch {} update {}; {} in this run, {} in a row stop it)\n",
      tty_ ? "\n" : "", ts.skipped, ts.skipped == 1 ? "" : "s", ep, update, st_.skipped_steps,
      args_.max_bad_steps);
  out_->log.write({{"type", "skip"},
                   {"epoch", ep},
                   {"update", update},
                   {"step", engine_->num_steps()},
                   {"skipped", ts.skipped},
                   {"skipped_steps", st_.skipped_steps},
                   {"elapsed_s", elapsed()}});
}

// Before each update (and at an epoch's end), what the stop rules act on: the budget's clock and
// verdict (no time left for the updates until the next check and the final evaluation) and,
// data parallel, a stop request (Ctrl-C, a scheduler's SIGTERM). One process reads its own
// clock and signal flag. Data parallel, every rank takes rank 0's, so that all stop at the same
// update (a rank that stopped alone would leave the others in a collective, and ZeRO-1's state
// gathers from every rank) and the time-based schedules (learning rate, image size) agree (a
// rank's own clock differs by its start-up time and drift). That broadcast makes the host wait
// for the GPU, so it happens about once a second (kCheckSeconds) and at each epoch's end.
void TrainRun::agree(bool epoch_end) {
  if (world_ == 1 && !plan_.budget) return;
  const int64_t step = engine_->num_steps();
  if (world_ > 1 && !epoch_end && step < agreed_.next) return;
  constexpr double kCheckSeconds = 1.0;
  // clock, verdict, updates until the next check, step time, stop request, final evaluation,
  // whether an epoch's evaluation fits before it
  double agreed[7] = {elapsed(), 0.0, 1.0, step_est_, g_stop_requested ? 1.0 : 0.0, 0.0, 1.0};
  if (rank_ == 0 && world_ > 1 && step_est_ > 0) {
    agreed[2] = std::clamp(std::floor(kCheckSeconds / step_est_), 1.0, 1e4);
    // Between checks the schedules extrapolate with 0.9 of the last interval's mean step time
    // (step_est_ leans high): the clock then lags a little and catches up at the check, and
    // never runs back, which could take the size curriculum down a size and up again.
    const double mean_step =
        step > agreed_.at ? (agreed[0] - agreed_.clock) / double(step - agreed_.at) : step_est_;
    agreed[3] = 0.9 * mean_step;
  }
  if (rank_ == 0 && plan_.budget) {
    agreed[1] = time_is_up(int64_t(agreed[2])) ? 1.0 : 0.0;
    agreed[5] = planner_->final_estimate();
    agreed[6] = planner_->interim_evaluation_fits() ? 1.0 : 0.0;
  }
  if (world_ > 1) comm_->broadcast(agreed, sizeof agreed, 0);
  agreed_.clock = world_ > 1 ? std::max(agreed[0], budget_clock()) : agreed[0];
  agreed_.time_up = agreed[1] != 0.0;
  agreed_.at = step;
  // After an epoch's end (its evaluation and state come next) the next update checks again.
  agreed_.next = epoch_end ? step : step + int64_t(agreed[2]);
  agreed_.step_s = agreed[3];
  agreed_.stop = agreed[4] != 0.0;
  agreed_.final_s = agreed[5];
  agreed_.interim_eval = agreed[6] != 0.0;
}

// The stop rules of the open-ended runs, on what agree() last settled: compute spent, or no
// time left.
bool TrainRun::budget_spent() const {
  if (et_ && !plan_.budget && compute_.done()) return true;
  return plan_.budget && agreed_.time_up;
}

// Ctrl-C or SIGTERM: data parallel, as rank 0 received it at the last agreement.
bool TrainRun::stop_requested() const {
  return world_ > 1 ? agreed_.stop : g_stop_requested.load();
}

// The agreed clock now: the last check's, plus the agreed step time for each update since.
double TrainRun::budget_clock() const {
  return agreed_.clock + double(engine_->num_steps() - agreed_.at) * agreed_.step_s;
}

// Rank 0's verdict: no time left for `updates` more updates and the final evaluation after
// (train/budget.h), with evaluation batches timed first when the rule asks for them.
bool TrainRun::time_is_up(int64_t updates) {
  // Resumed after its budget was spent, with no more budget than then.
  if (st_.spent_budget_s > 0 && plan_.budget->total_s <= st_.spent_budget_s) return true;
  if (planner_->wants_probe()) probe_eval();
  verdict_ = planner_->decide(updates);
  return verdict_.stop;
}

// The final evaluation in batches of B_: this rank's share of them, once or, with a model
// EMA, twice.
FinalEvalShape TrainRun::final_eval_shape() const {
  const int64_t batches = (int64_t(data_.val->size()) + B_ - 1) / B_;
  return {std::max<int64_t>(1, (batches + world_ - 1) / world_), args_.model_ema ? 2 : 1};
}

// A few evaluation batches at the evaluation size, timed for the budget (rank 0 alone; the
// other ranks wait for its verdict).
// Each probe goes to log.jsonl with what the stop rule makes of it, so that a run that ended
// early or late shows why.
void TrainRun::probe_eval() {
  const double t0 = elapsed();
  const std::vector<double> times = time_eval_batches(eval_model(), *data_.val, eval_bc_, B_,
                                                      planner_->probe_batches(), args_.workers);
  planner_->record_probe(times);
  const BudgetVerdict v = planner_->decide();
  out_->log.write({{"type", "budget_probe"},
                   {"step", engine_->num_steps()},
                   {"elapsed_s", t0},
                   {"batch_s", times},
                   {"one_eval_s", planner_->one_eval()},
                   {"final_s", v.final_s},
                   {"step_s", v.step_s}});
}

// One optimizer update (accum micro-batches), at the size and learning rate the schedules give
// now; returns the global samples it took.
Index TrainRun::train_update(int64_t epoch, int64_t u, EpochTally& t) {
  const auto t_step = std::chrono::steady_clock::now();
  // The schedules run on the clock all ranks agreed on (agree(), just before).
  if (plan_.budget)
    progress_ = budget_progress(*plan_.budget, budget_clock(), agreed_.final_s, progress_);
  const double frac = fraction(epoch, u);
  set_train_size(plan_.target_size(args_, epoch, frac), epoch, u, frac);
  const int S = cfg_.img_size;
  const double lr = plan_.lr_at(args_, engine_->num_steps(), frac);
  if (et_) batches_->set_magnitude(et_magnitude(frac));
  if (fail_at_.first == rank_ && engine_->num_steps() + 1 == fail_at_.second)
    throw Error(
        fmt::format("VIT_TEST_FAIL_AT: rank {} fails at update {}", rank_, fail_at_.second));
  engine_->zero_grad();
  Index step_samples = 0;
  for (Index a = 0; a < accum_; ++a) {
    const Index mb = u * accum_ + a;  // micro-batch index in the epoch
    double dt_data = 0;
    const bool planned = batches_->planned();
    const Index n =
        planned ? batches_->load_planned(epoch, mb, &dt_data) : batches_->load(epoch, mb, &dt_data);
    t.data_window += dt_data;
    t.data_epoch += dt_data;
    const bool inject = injected(engine_->num_steps() + 1);
    const float loss_scale = inject ? std::nanf("") : 1.0f / float(n * accum_ * world_);
    const uint64_t seed = mix_seed(args_.seed, uint64_t(engine_->num_steps()), uint64_t(a));
    if (planned)
      engine_->forward_backward_planned(batches_->plan(), batches_->lut(), batches_->targets(),
                                        loss_scale, seed);
    else
      engine_->forward_backward(batches_->images(), batches_->targets(), n, loss_scale, seed);
    step_samples += n * world_;  // the global batch
  }
  engine_->step(lr);
  if (args_.model_ema)
    engine_->update_ema(
        ema_decay(engine_->num_steps(), args_.model_ema_decay, args_.model_ema_warmup));
  compute_.add(int64_t(step_samples), S);
  t.samples += step_samples;
  ++updates_since_eval_;
  const double dt_step =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
  step_est_ = step_est_ == 0 ? dt_step : std::max(dt_step, 0.9 * step_est_ + 0.1 * dt_step);
  if (planner_) planner_->record_step(dt_step);
  ++t.window;
  const bool last = u + 1 == upe_;
  const bool log_now = (u + 1) % args_.log_interval == 0 || last;
  // The losses stay on the device between log points (no host sync per step on the GPU).
  if (read_every_step_ || log_now) take_stats(epoch, u + 1, t);
  if (log_now) log_progress(epoch, u, frac, lr, step_samples, t);
  return step_samples;
}

// The log line (the terminal, log.jsonl, the plot's curves) after update u, which ran at
// schedule fraction `frac`; resets the window.
void TrainRun::log_progress(int64_t epoch, int64_t u, double frac, double lr, Index step_samples,
                            EpochTally& t) {
  const int S = cfg_.img_size;
  const double dt =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t.t_window).count();
  const double ips = double(t.window * step_samples) / std::max(dt, 1e-9);
  const double f_now = fraction(epoch, u + 1);
  double eta;
  if (open_ended_) {
    eta = f_now > 0 ? (elapsed() - elapsed_before_) * (1 - f_now) / f_now : 0.0;
  } else {
    const double remaining_updates =
        double(upe_ - u - 1) + double(upe_) * (args_.epochs - epoch - 1);
    eta = remaining_updates * dt / std::max<int64_t>(t.window, 1);
  }
  TrainLine line{epoch,         u + 1, upe_, t.loss, mean_or_nan(t.loss_sum, t.loss_count),
                 dt / t.window, ips,   lr,   eta};
  if (data_.streamed()) {  // time spent waiting for batches, per update
    line.data_s = t.data_window / t.window;
    line.data_s_avg = t.data_epoch / t.loss_count;
  }
  const GpuStats gpu = gpu_monitor_ ? gpu_monitor_->read() : GpuStats{};
  std::string text = format_train_line(line);
  if (!gpu.empty()) text += "  " + format_gpu_stats(gpu);
  if (tty_)
    fmt::print("\r{}\033[K", text);
  else
    fmt::print("{}\n", text);
  std::fflush(stdout);
  nlohmann::json j = {{"type", "train"},
                      {"epoch", epoch},
                      {"update", u + 1},
                      {"step", engine_->num_steps()},
                      {"loss", t.loss},
                      {"loss_avg", mean_or_nan(t.loss_sum, t.loss_count)},
                      {"loss_window", mean_or_nan(t.loss_avg_window, t.window_losses)},
                      {"lr", lr},
                      {"grad_norm", t.gnorm},
                      {"samples", step_samples},  // global, this update (replay: fresh + replayed)
                      {"img_per_s", ips},
                      {"gflops", ips * flops_per_img_ * et_compute_weight(S, F_) / 1e9},
                      {"elapsed_s", elapsed()},
                      {"img_size", S},
                      {"fraction", f_now}};
  if (plan_.budget) j["budget_s"] = plan_.budget->total_s;
  if (st_.skipped_steps > 0) j["skipped_steps"] = st_.skipped_steps;
  add_gpu_stats(j, gpu);
  if (engine_->on_gpu()) j["device_mem_peak_gib"] = engine_->device_memory_bytes() / 1073741824.0;
  if (et_) {
    j["stage"] = et_stage(frac);
    j["magnitude"] = et_magnitude(frac);
    j["progress"] = compute_.progress();
  }
  out_->log.write(j);
  if (t.window_losses > 0)
    out_->plot.train_loss.push_back({elapsed(), t.loss_avg_window / t.window_losses});
  out_->plot.lr.push_back({elapsed(), lr});
  t.loss_avg_window = 0;
  t.window_losses = 0;
  t.data_window = 0;
  t.window = 0;
  t.t_window = std::chrono::steady_clock::now();
}

TrainRun::EpochEnd TrainRun::run_epoch(int64_t epoch) {
  const int64_t first_update = epoch == st_.epoch ? st_.update_in_epoch : 0;
  EpochTally t;
  const double t_epoch0 = elapsed();
  bool spent = false;
  int64_t u = first_update;
  for (; u < upe_; ++u) {
    agree();
    if (budget_spent()) {
      spent = true;
      break;
    }
    train_update(epoch, u, t);
    const bool stop_test =
        args_.stop_after_updates > 0 && engine_->num_steps() >= args_.stop_after_updates;
    if (stop_requested() || stop_test) {
      if (tty_) fmt::print("\n");
      save_state(epoch, u + 1);
      fmt::print(
          "Stopped at epoch {} update {}; state saved. Continue with: vitrain train "
          "--resume {}\n",
          epoch, u + 1, run_dir_);
      exit_code_ = stop_test ? 0 : 130;
      return EpochEnd::Interrupted;
    }
  }
  if (tty_) fmt::print("\n");
  take_stats(epoch, u, t);  // updates not yet read (a budget stop between log points)
  return end_epoch(epoch, u, first_update, spent, t, t_epoch0);
}

// After the epoch's updates: the profile, the evaluation (at --eval-interval, at the last
// epoch, or the final one of a spent budget), the state for --resume.
TrainRun::EpochEnd TrainRun::end_epoch(int64_t epoch, int64_t u, int64_t first_update, bool spent,
                                       const EpochTally& t, double t_epoch0) {
  const double train_seconds = elapsed() - t_epoch0;
  if (Profile::enabled()) {  // VIT_PROFILE=1: where this epoch's time went, per update
    Profile::print(stdout, int(std::max<int64_t>(1, u - first_update)));
    Profile::reset();
  }
  const double train_loss = t.loss_count ? t.loss_sum / t.loss_count : 0.0;
  const double ips = double(t.samples) / std::max(train_seconds, 1e-9);
  const double frac_now = fraction(epoch, u);
  const double lr_now =
      plan_.lr_at(args_, engine_->num_steps(), et_ ? std::min(1.0, frac_now) : frac_now);
  // An epoch that ends without time for one more update and the final evaluation makes its
  // evaluation the final one: the rule before each update budgets one evaluation, not this
  // epoch's and then the final one (a 20-s budget under load ended 0.02 s past it that way).
  if (!spent) {  // every rank alike: `spent` was agreed
    agree(/*epoch_end=*/true);
    spent = budget_spent();
  }
  if (spent) {  // the compute or time budget is spent: final evaluation at the final size
    if (verdict_.too_small) fmt::print("{}\n", planner_->too_small_line(engine_->num_steps()));
    const double t_final = elapsed();
    if (updates_since_eval_ > 0 || !evaluated_once_)
      eval_and_save(epoch, train_loss, ips, lr_now, frac_now);
    if (plan_.budget) st_.spent_budget_s = plan_.budget->total_s;
    if (u == upe_)
      save_state(epoch + 1, 0);  // as the next epoch's start would have
    else
      save_state(epoch, u);
    out_->write_plot();
    if (plan_.budget)
      fmt::print(
          "Budget: stopped after {:.1f}s of {:.1f}s ({:.1f}% used), {} updates; the final "
          "evaluation and checkpoint took {:.1f}s ({:.1f}s kept for them)\n",
          elapsed(), plan_.budget->total_s, 100.0 * elapsed() / plan_.budget->total_s,
          engine_->num_steps(), elapsed() - t_final, verdict_.final_s);
    else
      fmt::print("Compute budget spent: {:.0f} final-size images, {} updates\n", compute_.consumed,
                 engine_->num_steps());
    return EpochEnd::BudgetSpent;
  }
  const bool last = !open_ended_ && epoch + 1 == args_.epochs;
  bool do_eval = (epoch + 1) % args_.eval_interval == 0 || last;
  // A budget run skips an epoch's evaluation that would leave no time for the final one.
  if (do_eval && !last && plan_.budget && !agreed_.interim_eval) {
    fmt::print(
        "{}Budget: epoch {}'s evaluation skipped: with the final one after it ({:.1f}s each) it "
        "does not fit in the {:.1f}s left; the final evaluation comes at the stop\n",
        tty_ ? "\n" : "", epoch, agreed_.final_s, plan_.budget->usable_s() - budget_clock());
    do_eval = false;
  }
  if (!do_eval) {
    save_state(epoch + 1, 0);
    return EpochEnd::Done;
  }
  const double t_finish = elapsed();
  const bool stopped_early = !eval_and_save(epoch, train_loss, ips, lr_now, frac_now);
  save_state(stopped_early ? (open_ended_ ? epoch + 1 : args_.epochs) : epoch + 1, 0);
  out_->write_plot();
  // What the budget's final evaluation costs: evaluation, weights, state and plot.
  if (planner_) planner_->record_evaluation(elapsed() - t_finish);
  return stopped_early ? EpochEnd::StoppedEarly : EpochEnd::Done;
}

void TrainRun::print_summary() const {
  if (open_ended_) warn_if_ema_lags(engine_->num_steps(), "had");
  fmt::print("*** Best metric: {:.3f} (epoch {})\n", st_.best_metric, st_.best_epoch);
  if (data_.streamed()) fmt::print("Skipped {} unreadable images\n", unreadable());
  const auto& rows = out_->summary.rows();
  if (!rows.empty())
    fmt::print("Final test top-1: {:.2f}%  top-5: {:.2f}%  loss: {:.4f}  ({} of training{})\n",
               rows.back().eval_top1, rows.back().eval_top5, rows.back().eval_loss,
               format_duration(elapsed()),
               data_.streamed() ? fmt::format(", {} unreadable images skipped", unreadable())
                                : std::string());
  if (engine_->on_gpu())
    fmt::print("Peak device memory: {:.2f} GiB (model, activations, optimizer)\n",
               engine_->device_memory_bytes() / 1073741824.0);
  const GraphStats gs = engine_->graph_stats();
  if (gs.captures > 0 || !gs.off_reason.empty())
    fmt::print("CUDA graphs: {} passes replayed, {} captured{}\n", gs.replays, gs.captures,
               gs.off_reason.empty() ? std::string() : "; turned off: " + gs.off_reason);
  fmt::print("Run folder: {}\n", run_dir_);
}

int TrainRun::run() {
  for (int64_t epoch = st_.epoch; open_ended_ || epoch < args_.epochs; ++epoch) {
    const EpochEnd end = run_epoch(epoch);
    if (end == EpochEnd::Interrupted) return exit_code_;
    if (end != EpochEnd::Done) break;
  }
  print_summary();
  return 0;
}

}  // namespace

int run_train(const TrainArgs& args, const std::string& args_yaml) {
  TrainRun run(args, args_yaml);
  return run.run();
}

}  // namespace vit
