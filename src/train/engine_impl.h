// ModelEngine<Backend>: the Engine over one backend policy. Included by engine.cpp (host
// backends) and engine_cuda.cpp (CUDA).
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/profile.h"
#include "core/warning.h"
#include "model/model_plan.h"
#include "model/vit.h"
#include "ops/autotune.h"
#include "train/engine.h"
#include "train/grad_buckets.h"
#include "train/pass_graphs.h"
#include "train/planned_input.h"

namespace vit {

template <class Backend>
class ModelEngine : public Engine {
 public:
  using Store = typename Backend::Store;
  using Acc = typename Backend::Acc;
  template <class U>
  using Buffer = typename Backend::template Buffer<U>;

  explicit ModelEngine(const EngineOptions& opt)
      : plan_(make_plan(opt)),
        model_(opt.cfg, opt.max_batch, opt.max_img_size, plan_.get(),
               zero1_world(opt) > 0 ? Index(zero1_world(opt)) * 64 : 1),
        adamw_(opt.adamw),
        m_(size_t(moment_capacity(opt))),
        v_(size_t(moment_capacity(opt))),
        stats_(kNumStepStats),
        ema_(opt.ema ? size_t(capacity()) : 0) {
    ModelConfig big = opt.cfg;
    big.img_size = model_.max_img_size();
    const Index B = opt.max_batch, S = big.img_size;
    image_capacity_ = B * big.in_chans * S * S;
    if constexpr (Backend::kHost) {
      images_ = Buffer<Store>(size_t(image_capacity_));
      targets_ = Buffer<Acc>(size_t(B * big.num_classes));
    } else {
      // Two fp32 input slots [images | targets], alternated so the next batch's copy overlaps
      // the current step; bf16 models read a converted copy of the images.
      for (auto& in : input_) in = Buffer<float>(size_t(image_capacity_ + B * big.num_classes));
      if constexpr (!std::is_same_v<Store, float>) images_ = Buffer<Store>(size_t(image_capacity_));
    }
    Backend::zero(m_.data(), moment_capacity(opt));
    Backend::zero(v_.data(), moment_capacity(opt));
    Backend::zero(stats_.data(), kNumStepStats);
    if (opt.ema) Backend::zero(ema_.data(), capacity());
    // A NCCL world of one still runs its collectives, so one GPU tests the data-parallel path.
    if (opt.comm && (opt.comm->size() > 1 || opt.comm->name() == "nccl")) {
      VIT_CHECK(Backend::kHost || opt.comm->name() == "nccl",
                "data parallel on the GPU needs the NCCL communicator (this vitrain was built "
                "without NCCL)");
      comm_ = opt.comm;
      zero1_ = opt.shard_optimizer;
    }
    VIT_CHECK(opt.micro_batches >= 0, "engine: micro_batches must be >= 0");
    if (comm_ && !zero1_) overlap_micro_batches_ = opt.micro_batches;
    plan_buckets();
    // Graphs replay fixed kernels: not with collectives inside the pass.
    if (opt.cuda_graph && !Backend::kHost && !comm_)
      graphs_ = std::make_unique<PassGraphs<GraphOps>>();
  }

  std::string description() const override {
    return std::string(Backend::name()) + (graphs_ ? ", CUDA graphs" : "");
  }
  GraphStats graph_stats() const override {
    GraphStats g;
    if (graphs_) {
      g.on = graphs_->enabled();
      g.captures = graphs_->captures();
      g.replays = graphs_->replays();
    }
    g.off_reason = graphs_off_reason_;
    return g;
  }
  nlohmann::ordered_json kernel_plan() const override { return plan_->to_json(); }
  bool on_gpu() const override { return !Backend::kHost; }
  const ModelConfig& config() const override { return model_.config(); }
  const ParamTable& table() const override { return model_.table(); }
  Index max_batch() const override { return model_.max_batch(); }
  int64_t num_steps() const override { return steps_; }
  VitModel<Backend>& model() { return model_; }

  void zero_grad() override {
    if (sums_started_) {  // an update abandoned after its last micro-batch: let the sums land
      comm_->wait_all();
      sums_started_ = false;
    }
    model_.zero_grad();
    // ZeRO-1's reduce-scatter leaves the other ranks' blocks unspecified (MPI's in place one
    // sums into the first block): their padding is zeroed again before the next sum.
    if (zero1_) {
      const Index total = table().total;
      Backend::zero(model_.grads.data() + total, Index(padded_total()) - total);
    }
  }

  void forward_backward(const float* images, const float* targets, Index B, float loss_scale,
                        uint64_t seed) override {
    upload_batch(images, targets, B);
    train_on_input(B, loss_scale, seed);
  }

  void forward_backward_planned(const data::PlannedBatch& plan, const std::vector<float>& lut,
                                const float* targets, float loss_scale, uint64_t seed) override {
    upload_planned(plan, lut, targets);
    train_on_input(plan.size(), loss_scale, seed);
  }

  void stage_input(const float* images, const float* targets, Index B) override {
    upload_batch(images, targets, B);
    release_batch();
  }
  void stage_input_planned(const data::PlannedBatch& plan, const std::vector<float>& lut,
                           const float* targets) override {
    upload_planned(plan, lut, targets);
    release_batch();
  }
  void synchronize() override { Backend::synchronize(); }
  void mark_time() override { marks_.record(); }
  std::vector<double> take_marks() override {
    std::vector<double> s = marks_.seconds();
    marks_.clear();
    return s;
  }

  // The training pass over the uploaded batch: host work (the pass's state, stochastic-depth
  // scales) first, then the device work, eagerly or as a graph.
  void train_on_input(Index B, float loss_scale, uint64_t seed) {
    const ActivePlanScope kernels(plan_.get());
    VIT_CHECK(!sums_started_,
              "engine: more micro-batches in an update than EngineOptions::micro_batches");
    model_.begin_pass(cur_targets_, B, true, seed);
    const bool overlap = micro_batches_ + 1 == overlap_micro_batches_;
    auto pass = [&] {
      model_.forward_ops(cur_images_);
      Backend::loss_accumulate(stats_.data(), model_.losses(), B);
      if (overlap)
        model_.backward(Acc(loss_scale), [this](int stage) { start_sums(stage); });
      else
        model_.backward(Acc(loss_scale));
    };
    if (graphs_ && !Profile::enabled()) {  // the profile times each op: no graph then
      const PassKey key{cur_images_,       cur_targets_, B,
                        config().img_size, loss_scale,   config().drop_path > 0};
      try {
        graphs_->run(key, pass);  // eagerly, once graphs are off
      } catch (...) {  // the eager pass after a broken capture threw: still say why graphs went
        say_if_graphs_off();
        throw;
      }
      say_if_graphs_off();
    } else {
      pass();
    }
    release_batch();
    ++micro_batches_;
  }
  // Data parallel, the update's last micro-batch: the sums of the gradients that are final
  // now, while the backward pass goes on.
  void start_sums(int stage) {
    sums_started_ = true;  // from the first start: a pass that throws later still waits
    Acc* grads = model_.grads.data();
    for (const GradRange& r : buckets_.at(stage))
      comm_->allreduce_sum_start(grads + r.offset, size_t(r.count));
    comm_->progress();
  }
  void plan_buckets() {
    if (overlap_micro_batches_ > 0) buckets_ = GradBuckets(table(), config().depth);
  }

  void step(double lr) override {
    VIT_CHECK(micro_batches_ > 0, "engine: step() without a forward_backward()");
    ++steps_;
    if (zero1_) {
      sharded_step(lr);
    } else {
      if (comm_) reduce_over_ranks();
      Backend::close_update_loss(stats_.data(), micro_batches_);
      Backend::adamw_step(model_.params.data(), model_.weights(), m_.data(), v_.data(),
                          model_.grads.data(), stats_.data(), table().total, table().num_decay,
                          adamw_, lr, steps_);
    }
    micro_batches_ = 0;
    ++updates_since_read_;
  }

  TrainStats read_stats() override {
    double s[kNumStepStats];
    Backend::download(s, stats_.data(), kNumStepStats);
    TrainStats t;
    t.updates = updates_since_read_;
    t.skipped = int64_t(s[kSkipped]);
    t.loss_sum = s[kLossSum];
    t.last_loss = s[kLossLast];
    t.grad_norm = s[kGradNorm];
    t.bad_run = int64_t(s[kBadRun]);
    t.bad_run_max = int64_t(s[kBadRunMax]);
    for (int slot : {kLossSum, kSkipped, kBadRunMax}) Backend::zero(stats_.data() + slot, 1);
    updates_since_read_ = 0;
    return t;
  }

  void infer(const float* images, const float* targets, Index B, float* logits,
             float* losses) override {
    upload_batch(images, targets, B);
    const ActivePlanScope kernels(plan_.get());
    model_.forward(cur_images_, targets ? cur_targets_ : nullptr, B, false, 0);
    release_batch();
    Backend::download(logits, model_.logits(), B * config().num_classes);
    if (targets && losses) Backend::download(losses, model_.losses(), B);
  }

  std::vector<float> read_params() override {
    std::vector<float> p(size_t(table().total));
    Backend::download(p.data(), model_.params.data(), table().total);
    return p;
  }
  void write_params(const std::vector<float>& p) override {
    check_size(p, "parameters");
    Backend::upload(model_.params.data(), p.data(), table().total);
    model_.sync_weights();
  }
  void read_moments(std::vector<float>& m, std::vector<float>& v) override {
    m.resize(size_t(table().total));
    v.resize(size_t(table().total));
    if (zero1_) {  // collective: every rank's block to every rank
      gather_moment(m_.data(), m);
      gather_moment(v_.data(), v);
      return;
    }
    Backend::download(m.data(), m_.data(), table().total);
    Backend::download(v.data(), v_.data(), table().total);
  }
  void write_moments(const std::vector<float>& m, const std::vector<float>& v,
                     int64_t steps) override {
    check_size(m, "first moments");
    check_size(v, "second moments");
    const size_t lo = zero1_ ? shard_start() : 0;
    const Index n = zero1_ ? shard_params() : table().total;
    // The rest of the buffers (ZeRO-1's padding, a larger table's tail) holds zeros.
    for (Acc* x : {m_.data(), v_.data()}) Backend::zero(x + n, Index(m_.size()) - n);
    Backend::upload(m_.data(), m.data() + lo, n);
    Backend::upload(v_.data(), v.data() + lo, n);
    steps_ = steps;
  }
  bool has_ema() const override { return ema_.size() > 0; }
  void update_ema(double decay) override {
    check_ema();
    Backend::ema_update(ema_.data(), model_.params.data(), stats_.data(), table().total, decay);
  }
  std::vector<float> read_ema() override {
    check_ema();
    std::vector<float> e(size_t(table().total));
    Backend::download(e.data(), ema_.data(), table().total);
    return e;
  }
  void write_ema(const std::vector<float>& e) override {
    check_ema();
    check_size(e, "EMA weights");
    Backend::upload(ema_.data(), e.data(), table().total);
  }
  void swap_ema() override {
    check_ema();
    Backend::swap(ema_.data(), model_.params.data(), table().total);
    model_.sync_weights();  // the bf16 copy follows the master weights it now holds
  }

  void set_img_size(int size) override {
    model_.set_img_size(size);
    plan_buckets();  // the position embedding's size follows the image's
  }
  double device_memory_bytes() const override {
    if constexpr (Backend::kHost)
      return 0;
    else
      return Backend::peak_bytes();
  }

  StateMemory state_memory() const override {
    const double n = double(capacity());
    StateMemory mem;
    mem.weights = n * sizeof(Acc) + (std::is_same_v<Store, Acc> ? 0.0 : n * sizeof(Store));
    mem.grads = n * sizeof(Acc);
    mem.optimizer = 2.0 * double(m_.size()) * sizeof(Acc);
    mem.ema = double(ema_.size()) * sizeof(Acc);
    return mem;
  }

 private:
  Index capacity() const { return Index(model_.params.size()); }
  // ZeRO-1's world: the number of equal blocks the buffers are padded for; 0 without ZeRO-1.
  // A NCCL world of one still runs its collectives (see the constructor).
  static int zero1_world(const EngineOptions& opt) {
    if (!opt.shard_optimizer || !opt.comm) return 0;
    return opt.comm->size() > 1 || opt.comm->name() == "nccl" ? opt.comm->size() : 0;
  }
  // AdamW moments: the whole buffer, or under ZeRO-1 one block (the largest a table fits).
  Index moment_capacity(const EngineOptions& opt) const {
    const int world = zero1_world(opt);
    return world > 0 ? Index(shard_block(size_t(capacity()), world)) : capacity();
  }
  // ZeRO-1's partition of the table's parameters (comm.h's shard_block): every rank's block
  // size, this rank's first element, its parameters (the block less its padding), and the
  // padded length of the whole (world x block, within capacity()).
  size_t shard_size() const { return shard_block(size_t(table().total), comm_->size()); }
  size_t shard_start() const { return size_t(comm_->rank()) * shard_size(); }
  Index shard_params() const {
    const size_t total = size_t(table().total), lo = std::min(shard_start(), total);
    return Index(std::min(shard_size(), total - lo));
  }
  size_t padded_total() const { return size_t(comm_->size()) * shard_size(); }
  // ZeRO-1 update: the same AdamW as adamw_step on this rank's block, with the global grad
  // norm and loss (Backend::sharded_adamw), then every rank's updated block to every rank.
  // The padding carries zero gradients and is never updated, so it stays zero everywhere.
  void sharded_step(double lr) {
    const size_t block = shard_size(), lo = shard_start();
    Acc* grads = model_.grads.data();
    Acc* params = model_.params.data();
    double* stats = stats_.data();
    {
      ProfileScope prof("reduce-scatter (ZeRO-1)");
      comm_->reduce_scatter_sum(grads, block);
    }
    reduce_loss_over_ranks();
    Backend::close_update_loss(stats, micro_batches_);
    const Index n = shard_params(), decay = std::clamp(table().num_decay - Index(lo), Index(0), n);
    // Every rank judges the same global loss and norm, so all skip or none.
    if (!Backend::sharded_adamw(params + lo, m_.data(), v_.data(), grads + lo, stats, n, decay,
                                adamw_, lr, steps_, *comm_))
      return;
    {
      ProfileScope prof("all-gather (ZeRO-1)");
      comm_->allgather(params, block);
    }
    if constexpr (!std::is_same_v<Store, Acc>)
      Backend::convert(model_.weights(), params, table().total);
  }
  // ZeRO-1: every rank's block of a moment buffer (`mine`, this rank's) into `out`
  // (table().total), in pieces of at most kGatherPieceBytes over all ranks: a host-buffer
  // collective stages through device scratch of its size (the NCCL world keeps up to 1 MiB),
  // so a checkpoint never holds the whole moments in device memory.
  void gather_moment(const Acc* mine, std::vector<float>& out) {
    const size_t total = size_t(table().total), world = size_t(comm_->size());
    const size_t block = shard_size(), rank = size_t(comm_->rank());
    const size_t piece = std::max<size_t>(64, kGatherPieceBytes / sizeof(float) / world / 64 * 64);
    std::vector<float> buf(world * std::min(piece, block));  // (world, piece) host
    out.assign(total, 0.0f);
    for (size_t off = 0; off < block; off += piece) {
      const size_t c = std::min(piece, block - off);
      Backend::download(buf.data() + rank * c, mine + off, Index(c));
      comm_->allgather(buf.data(), c);
      for (size_t r = 0; r < world; ++r) {
        const size_t at = r * block + off;
        if (at < total) std::copy_n(buf.data() + r * c, std::min(c, total - at), out.data() + at);
      }
    }
  }
  static constexpr size_t kGatherPieceBytes = size_t(1) << 20;
  // Data parallel: the gradient sum and the update's loss over the ranks, before the update.
  // On the GPU both are NCCL collectives on device buffers, ordered after the backward pass on
  // the op stream (no host sync).
  void reduce_over_ranks() {
    if (sums_started_) {
      ProfileScope prof("allreduce wait (overlapped)");
      comm_->wait_all();
      sums_started_ = false;
    } else {
      ProfileScope prof("allreduce (data parallel)");
      comm_->allreduce_sum(model_.grads.data(), size_t(table().total));
    }
    reduce_loss_over_ranks();
  }
  // The update's loss as the mean over the ranks, so that a non-finite loss on one rank skips
  // the update on every rank.
  void reduce_loss_over_ranks() { comm_->allreduce_mean(stats_.data() + kLossPending, 1); }
  void check_ema() const { VIT_CHECK(has_ema(), "engine: made without a model EMA"); }
  // Once a capture broke, graphs_ runs every pass eagerly: say why, once.
  void say_if_graphs_off() {
    if (graphs_->enabled() || !graphs_off_reason_.empty()) return;
    graphs_off_reason_ = graphs_->off_reason();
    warn(fmt::format("CUDA graphs turned off ({}); training goes on without them",
                     graphs_off_reason_));
  }
  void check_size(const std::vector<float>& x, const char* what) const {
    VIT_CHECK(Index(x.size()) == table().total,
              fmt::format("engine: {} have {} values, the model needs {}", what, x.size(),
                          table().total));
  }
  void upload_batch(const float* images, const float* targets, Index B) {
    const ModelConfig& c = config();
    VIT_CHECK(B > 0 && B <= max_batch(), "engine: batch larger than the engine was made for");
    const Index n_images = B * c.in_chans * c.img_size * c.img_size, n_targets = B * c.num_classes;
    if constexpr (Backend::kHost) {
      Backend::upload(images_.data(), images, n_images);
      if (targets) Backend::upload(targets_.data(), targets, n_targets);
      cur_images_ = images_.data();
      cur_targets_ = targets_.data();
    } else {
      slot_ ^= 1;
      float* in = input_[slot_].data();  // (B, Cin, S, S) then (B, K)
      Backend::upload_input(in, images, n_images, in + image_capacity_, targets, n_targets, slot_);
      cur_targets_ = in + image_capacity_;
      if constexpr (std::is_same_v<Store, float>) {
        cur_images_ = in;
      } else {
        Backend::convert(images_.data(), in, n_images);
        cur_images_ = images_.data();
      }
    }
  }
  // A planned batch: expanded on the host into a float batch (host backends), or copied as
  // crops and tables and expanded on the device into the input slot (see planned_input.h).
  void upload_planned(const data::PlannedBatch& plan, const std::vector<float>& lut,
                      const float* targets) {
    const ModelConfig& c = config();
    const Index B = plan.size();
    VIT_CHECK(plan.C == c.in_chans && plan.out_side() == c.img_size,
              fmt::format("engine: a planned batch of {}-channel {} px images for a model of {} "
                          "channels at {} px",
                          plan.C, plan.out_side(), c.in_chans, c.img_size));
    VIT_CHECK(Index(lut.size()) == plan.C * 256, "engine: the lookup table needs (C, 256) values");
    VIT_CHECK(B > 0 && B <= max_batch(), "engine: batch larger than the engine was made for");
    if constexpr (Backend::kHost) {
      planned_images_.resize(size_t(B * c.in_chans * c.img_size * c.img_size));
      expand_on_host(plan, lut, planned_images_.data());
      upload_batch(planned_images_.data(), targets, B);
    } else {
      slot_ ^= 1;
      float* in = input_[slot_].data();  // (B, Cin, S, S) then (B, K)
      cur_targets_ = in + image_capacity_;
      if constexpr (std::is_same_v<Store, float>) {
        planned_.expand(plan, lut, targets, in + image_capacity_, B * c.num_classes, slot_, in);
        cur_images_ = in;
      } else {  // straight to the bf16 images: one rounding, as convert() of the fp32 slot
        planned_.expand(plan, lut, targets, in + image_capacity_, B * c.num_classes, slot_,
                        images_.data());
        cur_images_ = images_.data();
      }
    }
  }
  // The model is done with the current batch: its input slot may take the batch after next.
  void release_batch() {
    if constexpr (!Backend::kHost) Backend::input_released(slot_);
  }

  // The kernel plan (ops/kernel_plan.h): made before the model, whose buffers follow its
  // attention choice; active around every pass.
  static std::unique_ptr<KernelPlan> make_plan(const EngineOptions& opt) {
    auto plan = std::make_unique<KernelPlan>(Backend::device_props(), opt.kernels);
    if (!Backend::kFusedAttention) return plan;  // the CPU reference: one kernel an op
    if (opt.kernels.autotune && !Backend::kHost)
      plan->set_tuner(std::make_shared<Autotuner>(default_autotune_cache_path()));
    if (!opt.recorded_kernels.is_null()) plan->replay(opt.recorded_kernels);
    plan_model(*plan, opt.cfg, opt.max_batch, opt.plan_sizes, storage_of<Store>());
    return plan;
  }

  std::unique_ptr<KernelPlan> plan_;
  VitModel<Backend> model_;
  AdamWConfig adamw_;
  Buffer<Acc> m_, v_;                  // (capacity) AdamW moments, table layout
  Index image_capacity_ = 0;           // elements of one batch of images at the largest size
  Buffer<Store> images_;               // (B, Cin, S, S): the batch (host) or its bf16 copy (device)
  Buffer<Acc> targets_;                // (B, K) host backends only
  Buffer<float> input_[2];             // device: two slots of (B, Cin, S, S) + (B, K) fp32
  int slot_ = 1;                       // device: the input slot of the current batch
  const Store* cur_images_ = nullptr;  // the current batch, in the backend's memory
  const Acc* cur_targets_ = nullptr;
  std::vector<float> planned_images_;    // host: a planned batch expanded, (B, Cin, S, S)
  DevicePlannedInput<Backend> planned_;  // device: a planned batch's buffers and scratch
  Buffer<double> stats_;  // (kNumStepStats) the updates' losses, grad norm, skips (StepStat)
  Buffer<Acc> ema_;       // (capacity) model EMA, table layout; empty without one
  int64_t steps_ = 0;
  int micro_batches_ = 0;          // since the last step
  std::shared_ptr<Comm> comm_;     // data parallel (a world of more than one), else null
  bool zero1_ = false;             // ZeRO-1 over comm_
  int overlap_micro_batches_ = 0;  // EngineOptions::micro_batches, where the sums overlap
  GradBuckets buckets_;            // the gradient ranges final at each backward stage
  bool sums_started_ = false;      // the update's gradient sums are under way
  int64_t updates_since_read_ = 0;
  using GraphOps = typename GraphOpsOf<Backend>::type;
  std::unique_ptr<PassGraphs<GraphOps>> graphs_;  // EngineOptions::cuda_graph, where possible
  std::string graphs_off_reason_;
  typename Backend::Marks marks_;  // mark_time()
};

}  // namespace vit
