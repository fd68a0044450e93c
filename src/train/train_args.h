// The options of a training run (`vitrain train`'s flags, timm's names). The CLI fills them
// (src/cli/train_args.h: flags, YAML config, args.yaml); the trainer only reads them.
#pragma once
#include <cstdint>
#include <string>

namespace vit {

struct TrainArgs {
  // Data and model.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string model = "vit_fmnist_hybrid";
  int img_size = 0;       // 0 = the preset's
  int num_classes = 0;    // 0 = from the data
  std::string gp;         // "" (preset) | token | avg
  std::string ffn;        // "" (preset) | mlp | local
  std::string class_map;  // ImageFolder class order: one name per line ("" = sorted folders)
  double drop_path = 0.0;
  std::string stem;  // patch embedding: patch | conv (the hybrid conv stem) | "" (the preset's)
  // Optimisation.
  int batch_size = 64;
  int grad_accum_steps = 1;
  int epochs = 6;
  std::string opt = "adamw";
  double lr = 2e-3;
  double min_lr = 1e-5;
  double warmup_epochs = 0.2;
  double warmup_lr = 1e-6;
  double weight_decay = 0.05;
  double clip_grad = 0.0;  // 0 = off
  double smoothing = 0.1;
  // Augmentation. The defaults are the Fashion-MNIST recipe's (no crop, no flip: they cost
  // accuracy in a 6-epoch run) and timm's for image folders (flip 0.5).
  int crop_pad = 0;     // in-memory data: random crop of the zero-padded image
  double hflip = -1.0;  // flip probability; -1 = 0.5 for image folders, 0 for in-memory data
  // timm augmentation pipeline (data/augment.h, train/batch_config.h). All off by default: the
  // pad-crop path above stays the default recipe's.
  std::string aa;                    // RandAugment, e.g. rand-m9-mstd0.5-inc1 ("" = off)
  double reprob = 0.0;               // RandomErasing probability
  int aug_repeats = 1;               // repeated augmentation: times each sample is seen per epoch
  double mixup = 0.0, cutmix = 0.0;  // Beta alphas (0 = off)
  double mixup_prob = 1.0, mixup_switch_prob = 0.5;
  double color_jitter = 0.0;  // ColorJitter strength (timm's default is 0.4)
  std::string scale;          // "LO,HI": RandomResizedCrop area range ("" = no RRC)
  std::string ratio = "0.75,1.3333333333333333";  // RRC aspect range "LO,HI"
  std::string train_interpolation = "bicubic";    // bilinear | bicubic | random
  double crop_pct = 0.0;  // eval: resize to size / crop_pct + centre crop (0 = plain resize)
  // Run.
  int64_t seed = 42;
  std::string output = "./output/train";
  std::string experiment;
  std::string resume;
  std::string initial_checkpoint;
  int log_interval = 50;
  int eval_interval = 1;
  int patience = 0;  // early stopping after this many evaluations without improvement; 0 = off
  bool model_ema = false;           // timm's --model-ema: an EMA of the weights
  double model_ema_decay = 0.9998;  // timm's default
  bool shard_optimizer = false;     // ZeRO-1 under mpirun (docs/distributed.md)
  double dist_timeout = 600;        // seconds a collective may wait (0 = forever)
  bool model_ema_warmup = false;    // timm ModelEmaV3's decay warm-up (gamma 1, power 2/3)
  int max_bad_steps = 10;       // this many consecutive non-finite (skipped) updates stop the run
  int workers = 0;              // threads; 0 = all cores
  std::string device = "auto";  // auto | cpu | cuda | emu (CPU bf16 emulation)
  std::string precision = "bf16";  // cuda: bf16 or fp32
  bool fp32_residual = false;      // bf16 modes: the residual stream in fp32
  // The kernel options (ops/kernel_options.h), "k=v,..."; "" = the defaults.
  std::string kernels;
  bool cuda_graph = true;          // cuda: each micro-batch's pass replayed as a CUDA graph
  // Resize, flip and normalise where the model runs (the GPU's batched input ops): the loader
  // ships planned uint8 crops (data/planned_batch.h).
  bool augment_on_device = false;
  std::string config;              // the -c/--config file that was applied ("" = none)
  int64_t stop_after_updates = 0;  // testing: save the state and stop after this many updates
  // Seed methods (methods.md §1.4, §2.3).
  std::string curriculum = "none";  // none | size | efficienttrain
  int init_size = 0;                // size curriculum: first size (0 = one patch step)
  int size_step = 0;                // size curriculum: pixels added per step (0 = patch size)
  int size_every = 1;               // size curriculum: epochs per size step
  std::string lowfreq = "fft";      // efficienttrain low-frequency crop: fft | downsample
  std::string et_table = "deit";    // efficienttrain sizes: deit | swin | convnext | 10 sizes
  double et_warmup = 0.2;           // efficienttrain warm-up, fraction of the compute
  std::string budget;               // wall-clock budget ("24h", "90m", "45s"); "" = --epochs
  int replay = 1;                   // replay-buffer repeats per fresh batch (1 = off)
  int eval_size = 0;                // evaluation size (0 = the final training size)
};

}  // namespace vit
