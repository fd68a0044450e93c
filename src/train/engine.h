// The engine: what the trainer, eval and bench talk to, whatever the device. It owns a model, its
// AdamW moments and its input buffers in one backend's memory; the trainer hands it host batches
// and reads results back only at log, eval and checkpoint points (on the GPU the losses and the
// grad norm stay on the device between them).
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/planned_batch.h"
#include "dist/comm.h"
#include "dist/launch_env.h"
#include "model/config.h"
#include "model/params.h"
#include "ops/kernel_options.h"
#include "ops/cpu/adamw.h"

namespace vit {

struct EngineOptions {
  std::string device = "cpu";      // cpu | emu (CPU bf16 emulation) | cuda; see resolve_device
  std::string precision = "bf16";  // cuda only: bf16 (fp32 master weights) or fp32
  ModelConfig cfg;                 // the model at its current training size
  Index max_batch = 1;             // samples per forward pass, at most
  int max_img_size = 0;            // the largest image size of the run (0 = cfg.img_size)
  // bf16 modes (emu, cuda bf16): keep the residual stream and its gradient in fp32, as PyTorch
  // autocast does; the other activations stay bf16. No effect in fp32 modes.
  bool fp32_residual = false;
  AdamWConfig adamw;
  bool ema = false;  // keep an exponential moving average of the weights (model EMA)
  // Data parallel: step() sums the gradients and the update's loss over the ranks first (each
  // rank's loss_scale covers the global batch, so the sum is the global mean). Null or a world
  // of one: a plain single-process engine, except a NCCL world of one, which runs its
  // collectives (one GPU tests the path). GPU engines need a NCCL world.
  std::shared_ptr<Comm> comm;
  // ZeRO-1 over `comm`: gradients reduce-scattered, each rank updates its block of the weights
  // and keeps only that block of the AdamW moments, the weights all-gathered.
  bool shard_optimizer = false;
  // Micro-batches per update, where every update has that many (the trainer's accumulation
  // steps); 0 = not known. Data parallel (without ZeRO-1) then sums the gradients over the
  // ranks during the last micro-batch's backward pass, block by block as their gradients
  // become final (train/grad_buckets.h), overlapped with the blocks still to run; step() waits
  // for the sums. No collective runs in the other micro-batches. An update with fewer
  // micro-batches sums in step(), as with 0; one with more is an error.
  int micro_batches = 0;
  // GPU: replay each micro-batch's forward and backward as a CUDA graph (train/pass_graphs.h).
  // No effect on the host backends, in data parallel runs or while the op profile runs.
  bool cuda_graph = false;
  // The kernels (ops/kernel_plan.h): the user's options; the run's image sizes, so the plan
  // covers every shape of a size curriculum (empty: cfg's size); a resumed run's recorded plan
  // (its kernels.json), replayed as it was (null: plan afresh).
  KernelOptions kernels;
  std::vector<int> plan_sizes;
  nlohmann::json recorded_kernels;
};

// CUDA graphs of the training pass (EngineOptions::cuda_graph).
struct GraphStats {
  bool on = false;         // graphs are in use (asked for, possible, not turned off)
  int64_t captures = 0;    // passes captured
  int64_t replays = 0;     // passes replayed from a graph captured earlier
  std::string off_reason;  // why graphs turned off during the run, if they did
};

// Bytes one rank holds for the training state (device memory on the GPU, host memory on the
// CPU), by part: what ZeRO-1 divides (the moments) and what it keeps whole.
struct StateMemory {
  double weights = 0;    // fp32 master weights, plus their bf16 copy in bf16 modes
  double grads = 0;      // gradients (fp32)
  double optimizer = 0;  // AdamW m and v (fp32): all of them, or this rank's ZeRO-1 block
  double ema = 0;        // model EMA (fp32), if kept
  double total() const { return weights + grads + optimizer + ema; }
};
// "Training state per rank: 10.7 MiB in device memory (weights 2.7, gradients 1.8, AdamW
// moments 3.6 (ZeRO-1: 1/2), EMA 1.8)"; shards: the ranks the moments are divided over.
std::string format_state_memory(const StateMemory& mem, bool on_gpu, int shards);

// Losses and grad norm of the updates since the previous read_stats(). An update whose loss or
// grad norm is not finite is skipped (weights and moments untouched) and counted instead.
struct TrainStats {
  int64_t updates = 0;      // updates made since the previous read, skipped ones included
  int64_t skipped = 0;      // of those, skipped
  double loss_sum = 0;      // sum over the applied updates of each update's mean loss
  double last_loss = 0;     // the last update's mean loss (not finite when it was skipped)
  double grad_norm = 0;     // the last update's global grad norm (before clipping)
  int64_t bad_run = 0;      // consecutive skipped updates ending with the last update
  int64_t bad_run_max = 0;  // the longest run of consecutive skipped updates since the read
  int64_t applied() const { return updates - skipped; }
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string description() const = 0;  // e.g. "cpu fp32", "cuda bf16 (NVIDIA H100)"
  virtual bool on_gpu() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual const ParamTable& table() const = 0;
  virtual Index max_batch() const = 0;
  virtual int64_t num_steps() const = 0;  // AdamW updates done

  // Training: zero_grad, then forward_backward per micro-batch, then step.
  virtual void zero_grad() = 0;
  // images (B, Cin, S, S) normalised, targets (B, K) soft targets, both on the host. Adds the
  // gradient of loss_scale * sum of the B losses, and the micro-batch's mean loss to the
  // update's loss.
  virtual void forward_backward(const float* images, const float* targets, Index B,
                                float loss_scale, uint64_t seed) = 0;
  // forward_backward on a planned batch (data/planned_batch.h): the images are made where the
  // model runs, on the GPU by the batched input ops (uint8 crops travel instead of float
  // images), on the host by their CPU reference. lut (C, 256): data::normalize_lut. The plan's
  // images must have the model's channels and current size.
  virtual void forward_backward_planned(const data::PlannedBatch& plan,
                                        const std::vector<float>& lut, const float* targets,
                                        float loss_scale, uint64_t seed) = 0;
  // The input stage alone, for `vitrain bench-data --device`: the batch's copy to the device
  // and, for a planned batch, the input ops make the model's input exactly as
  // forward_backward(_planned) would; the model does no work and the input slot is released at
  // once. Asynchronous on the GPU: synchronize() waits for it.
  virtual void stage_input(const float* images, const float* targets, Index B) = 0;
  virtual void stage_input_planned(const data::PlannedBatch& plan, const std::vector<float>& lut,
                                   const float* targets) = 0;
  virtual void synchronize() = 0;  // waits for everything enqueued on the device
  // Timing enqueued work without waiting for it (bench's chunks): mark_time() marks the point
  // after everything enqueued so far, in the device's order of work; after synchronize() or
  // read_stats(), take_marks() returns each mark's seconds after the first and forgets them.
  virtual void mark_time() = 0;
  virtual std::vector<double> take_marks() = 0;

  // One AdamW update with learning rate lr; the update's loss is the mean of its micro-batches'.
  // Skipped (nothing written) when that loss or the grad norm is not finite; the schedule's
  // step count and AdamW's bias correction still count it.
  virtual void step(double lr) = 0;
  virtual TrainStats read_stats() = 0;  // synchronises with the device

  // Inference on host images (B, Cin, S, S): logits (B, K) and, when targets (B, K) are given,
  // the per-sample losses (B), written to host arrays.
  virtual void infer(const float* images, const float* targets, Index B, float* logits,
                     float* losses) = 0;

  // The fp32 master weights and AdamW moments in table() layout (table().total elements).
  virtual std::vector<float> read_params() = 0;
  virtual void write_params(const std::vector<float>& params) = 0;
  virtual void read_moments(std::vector<float>& m, std::vector<float>& v) = 0;
  virtual void write_moments(const std::vector<float>& m, const std::vector<float>& v,
                             int64_t steps) = 0;
  // Model EMA (EngineOptions::ema), fp32 in table() layout like the master weights.
  virtual bool has_ema() const = 0;
  // ema = lerp(ema, weights, 1 - decay) after the last step(), unless that update was skipped;
  // decay 0 copies the weights. PyTorch's fused lerp: bitwise Tensor.lerp_ in fp32.
  virtual void update_ema(double decay) = 0;
  virtual std::vector<float> read_ema() = 0;
  virtual void write_ema(const std::vector<float>& ema) = 0;
  // Exchanges the weights and their EMA (exact; a second call restores): evaluates or saves
  // the EMA with the training model's own buffers.
  virtual void swap_ema() = 0;

  // Switches the image size (buffers stay); write the remapped params and moments next.
  virtual void set_img_size(int size) = 0;
  // Device memory held by this engine's buffers (0 on the host).
  virtual double device_memory_bytes() const { return 0; }
  virtual StateMemory state_memory() const = 0;
  virtual GraphStats graph_stats() const { return {}; }
  // The resolved kernel plan (KernelPlan::to_json): the run folder's kernels.json.
  virtual nlohmann::ordered_json kernel_plan() const = 0;
};

std::unique_ptr<Engine> make_engine(const EngineOptions& opt);

// cpu | emu | cuda stay; auto becomes cuda when a GPU is usable, else cpu. cuda without a usable
// GPU (or in a build without the CUDA backend) throws vit::Error with the reason.
std::string resolve_device(const std::string& device);

// The CUDA backend registers itself here (vitrain's main, the GPU tests), so the CPU-only
// library never links CUDA.
struct CudaEngineHooks {
  int (*device_count)(std::string* why) = nullptr;
  std::unique_ptr<Engine> (*make)(const EngineOptions&) = nullptr;
  // The NCCL world (dist/comm_nccl.h); null in builds without NCCL.
  std::shared_ptr<Comm> (*make_nccl_comm)(const LaunchEnv&, Comm* bootstrap,
                                          double timeout_s) = nullptr;
};
void register_cuda_engine(const CudaEngineHooks& hooks);
bool cuda_engine_linked();

// The world of this process for a run on `device` (resolved: cpu, emu or cuda): one process
// is a world of one; on the CPU, mpirun's ranks meet through MPI; on the GPU through NCCL
// (bootstrapped by MPI under mpirun, over TCP under torchrun / srun). Clear errors where the
// build lacks what the launch needs. `timeout_s`: --dist-timeout.
std::shared_ptr<Comm> make_run_comm(const std::string& device, double timeout_s);

}  // namespace vit
