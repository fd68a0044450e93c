// vitrain train --augment-on-device: the loader ships planned crops and the engine makes the
// images where the model runs. On the CPU (and in the bf16 emulation) that is the reference
// expansion, so a run must train as the plain run does: the same per-update losses up to the
// rounding of the normalisation (1e-5 relative), with random erasing, mixup/cutmix, RandAugment,
// colour jitter and EfficientTrain++'s low-frequency pass too. Pipelines whose augmentation runs
// on the CPU (the replay buffer, an in-memory set's pad-and-crop) are refused with one clear line.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "cli_harness.h"

using vit::testing::run_vitrain;
using vit::testing::RunResult;

namespace {

class AugmentOnDeviceCli : public vit::testing::CliTest {
 protected:
  // RandomResizedCrop + flip on the toy IDX set (in memory: --scale selects the timm pipeline).
  std::string flags(const std::string& experiment, const std::string& extra) {
    // --img-size 8 and --epochs 2 unless extra sets them
    auto unless_set = [&](const std::string& flag, const std::string& value) {
      return extra.find(flag) == std::string::npos ? " " + flag + " " + value : std::string();
    };
    return "train --data-dir " + data_ + " --model vit_fmnist_tiny" +
           unless_set("--img-size", "8") + unless_set("--epochs", "2") + " --output " +
           (dir_ / "out").string() + " --experiment " + experiment +
           " -b 32 --lr 2e-3 --warmup-epochs 1 --log-interval 1 -j 2 --seed 5 " +
           "--scale 0.5,1 --hflip 0.5 --crop-pad 0 " + extra;
  }
  std::map<int64_t, double> losses(const std::string& experiment) {
    return vit::testing::train_losses(dir_ / "out" / experiment);
  }
  // rel: the losses' relative tolerance (1e-5: one rounding of the normalisation apart).
  void expect_same_training(const std::string& device, const std::string& extra = "",
                            const std::string& name = "", double rel = 1e-5) {
    const std::string tag = device + name;
    const RunResult a =
        run_vitrain(flags("plain_" + tag, "--device " + device + extra), dir_.string());
    ASSERT_EQ(a.exit_code, 0) << a.err;
    const RunResult b =
        run_vitrain(flags("planned_" + tag, "--device " + device + extra + " --augment-on-device"),
                    dir_.string());
    ASSERT_EQ(b.exit_code, 0) << b.err;
    const auto la = losses("plain_" + tag), lb = losses("planned_" + tag);
    ASSERT_EQ(la.size(), lb.size());
    ASSERT_GE(la.size(), 16u);
    size_t exact = 0;
    for (const auto& [step, loss] : la) {
      ASSERT_TRUE(lb.count(step)) << step;
      EXPECT_NEAR(lb.at(step), loss, rel * std::fabs(loss)) << device << " step " << step;
      exact += lb.at(step) == loss;
    }
    std::printf("%s: %zu of %zu updates with bitwise equal losses\n", tag.c_str(), exact,
                la.size());
  }
};

TEST_F(AugmentOnDeviceCli, TrainsAsThePlainRunOnTheCpu) {
  expect_same_training("cpu");
}

TEST_F(AugmentOnDeviceCli, TrainsAsThePlainRunInTheBf16Emulation) {
  expect_same_training("emu");
}

// Random erasing and mixup/cutmix: drawn on the host (the targets mixed there), the images
// erased and mixed where they are made.
TEST_F(AugmentOnDeviceCli, ErasingMixupAndCutmixTrainAsThePlainRun) {
  expect_same_training("cpu", " --reprob 0.5 --mixup 0.8 --cutmix 1.0 --smoothing 0.1", "_mix");
  expect_same_training("emu", " --reprob 0.5 --mixup 0.8 --cutmix 1.0 --smoothing 0.1", "_mix");
}

// RandAugment (every op at full probability, so each batch has geometric and table ops) and
// colour jitter: drawn on the host as pixel steps, applied to the uint8 images where they are
// made.
TEST_F(AugmentOnDeviceCli, RandAugmentAndColourJitterTrainAsThePlainRun) {
  expect_same_training("cpu", " --aa rand-n3-m9-p1.0-mstd0.5 --reprob 0.25", "_ra");
  expect_same_training("emu", " --aa rand-m9-mstd0.5-inc1", "_ra");
  expect_same_training("cpu", " --color-jitter 0.4", "_cj");
}

// EfficientTrain++: planned at the final size (16), the low-frequency pass to the stage's size
// as matrix products where the images are made, against the plain run's per-image FFTW crop
// and antialiased down-sampling (equal to ~1e-6 of the image, hence the wider tolerance).
TEST_F(AugmentOnDeviceCli, EfficientTrainTrainsAsThePlainRun) {
  const std::string et = " --img-size 16 --epochs 1 --curriculum efficienttrain --lowfreq ";
  expect_same_training("cpu", et + "fft --reprob 0.25 --mixup 0.8 --cutmix 1.0", "_etfft", 1e-4);
  expect_same_training("cpu", et + "downsample --aa rand-m9-mstd0.5", "_etds", 1e-4);
  for (const std::string run : {"planned_cpu_etfft", "planned_cpu_etds"}) {
    std::set<int> sizes;  // the pass ran: updates below the final size, and at it
    for (const auto& j : vit::testing::read_log(dir_ / "out" / run, "train"))
      sizes.insert(j.at("img_size").get<int>());
    EXPECT_GE(sizes.size(), 2u) << run;
    EXPECT_LT(*sizes.begin(), 16) << run;
  }
}

TEST_F(AugmentOnDeviceCli, CpuOnlyAugmentationIsOneClearError) {
  for (const std::string extra : {"--scale '' --crop-pad 2", "--replay 2"}) {
    const RunResult r =
        run_vitrain(flags("refused", extra + " --device cpu --augment-on-device"), dir_.string());
    EXPECT_NE(r.exit_code, 0) << extra;
    EXPECT_NE(r.err.find("--augment-on-device"), std::string::npos) << extra << ": " << r.err;
    EXPECT_EQ(r.err.find("terminate"), std::string::npos) << extra << ": " << r.err;
  }
}

}  // namespace
