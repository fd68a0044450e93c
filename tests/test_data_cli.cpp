// End-to-end: `vitrain train` / `eval` on a generated ImageFolder and on the packed files of
// `vitrain prepare`, an unreadable image skipped and reported, --class-map, and prepare's
// one-line errors for bad input.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli_harness.h"
#include "core/rng.h"
#include "data/decode.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using vit::data::Image;
using vit::testing::read_log;
using vit::testing::RunResult;
using vit::testing::slurp;

namespace {

void write_bytes(const fs::path& p, const std::vector<uint8_t>& b) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}

size_t count_of(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = 0; (p = s.find(what, p)) != std::string::npos; p += what.size()) ++n;
  return n;
}

// cat: a bright disc on dark; dog: dark disc on bright. 40x30, PNG and JPEG alternating.
Image toy(int k, int i) {
  Image img(30, 40, 3);
  vit::Rng rng(uint64_t(100 * k + i));
  for (int y = 0; y < 30; ++y)
    for (int x = 0; x < 40; ++x) {
      const bool disc = (x - 20) * (x - 20) + (y - 15) * (y - 15) < 100;
      const int v = (disc != (k == 1)) ? 200 : 40;
      for (int c = 0; c < 3; ++c) img.at(y, x)[c] = uint8_t(v + rng.below(30));
    }
  return img;
}

// CliTest's scratch folder (and toy IDX data in data_), plus an ImageFolder of 40x30 photos.
class DataCli : public vit::testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    photos_ = dir_ / "photos";
    const char* names[2] = {"cat", "dog"};
    for (auto [split, n] : {std::pair{"train", 16}, std::pair{"val", 4}})
      for (int k = 0; k < 2; ++k)
        for (int i = 0; i < n; ++i) {
          const Image img = toy(k, i + (split[0] == 'v') * 50);
          const bool jpg = i % 2 == 1;
          write_bytes(photos_ / split / names[k] / (std::to_string(i) + (jpg ? ".jpg" : ".png")),
                      jpg ? vit::data::encode_jpeg(img, 90) : vit::data::encode_png(img));
        }
    // One corrupt file among the training images.
    write_bytes(photos_ / "train" / "dog" / "broken.jpg", {0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3});
  }

  RunResult run(const std::string& args) { return vit::testing::run_vitrain(args, dir_.string()); }

  // Batch 11: the 33 training files (the broken one included) are all drawn in one epoch.
  std::string train_flags(const fs::path& data, const std::string& exp,
                          const std::string& extra = "") {
    return "train --data-dir " + data.string() +
           " --model vit_fmnist_tiny --img-size 16 -b 11 --epochs 1 --warmup-epochs 0 "
           "--log-interval 1 -j 2 --seed 3 --output " +
           (dir_ / "out").string() + " --experiment " + exp + " " + extra;
  }

  fs::path photos_;
};

TEST_F(DataCli, TrainOnImageFolderSkipsTheBrokenImageAndEvaluates) {
  const RunResult r = run(train_flags(photos_, "folder"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Final test top-1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Skipped 1 unreadable images"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(", 1 unreadable images skipped)"), std::string::npos) << r.out;
  EXPECT_EQ(count_of(r.err, "warning: skipping unreadable image"), 1u) << r.err;
  EXPECT_NE(r.err.find("broken.jpg"), std::string::npos) << r.err;
  const fs::path run_dir = dir_ / "out" / "folder";
  EXPECT_EQ(slurp(run_dir / "classes.txt"), "cat\ndog\n");
  // The eval entry of log.jsonl carries the count.
  const auto evals = read_log(run_dir, "eval");
  ASSERT_EQ(evals.size(), 1u);
  EXPECT_EQ(evals[0].at("skipped_images"), 1);
  // ImageNet normalisation is recorded for eval/export; eval works on the folder.
  const RunResult e = run("eval --checkpoint " + (run_dir / "last.safetensors").string() +
                          " --data-dir " + photos_.string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("(8 images)"), std::string::npos) << e.out;
  EXPECT_NE(e.out.find("Skipped 0 unreadable images"), std::string::npos) << e.out;
}

TEST_F(DataCli, ClassMapPinsTheClassOrder) {
  write_bytes(dir_ / "map.txt", {'d', 'o', 'g', '\n', 'c', 'a', 't', '\n'});
  const RunResult r =
      run(train_flags(photos_, "mapped", "--class-map " + (dir_ / "map.txt").string()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(slurp(dir_ / "out" / "mapped" / "classes.txt"), "dog\ncat\n");
  EXPECT_NE(slurp(dir_ / "out" / "mapped" / "args.yaml").find("class_map"), std::string::npos);
  // Eval follows the checkpoint's class order by itself.
  const RunResult e =
      run("eval --checkpoint " + (dir_ / "out" / "mapped" / "last.safetensors").string() +
          " --data-dir " + photos_.string());
  EXPECT_EQ(e.exit_code, 0) << e.err;
  // A class map missing a class folder is one clear error.
  write_bytes(dir_ / "short.txt", {'c', 'a', 't', '\n'});
  const RunResult bad =
      run(train_flags(photos_, "bad", "--class-map " + (dir_ / "short.txt").string()));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("not in the class map"), std::string::npos) << bad.err;
  // In-memory data has no class folders to order.
  const RunResult idx =
      run(train_flags(data_, "idx", "--class-map " + (dir_ / "map.txt").string()));
  EXPECT_EQ(idx.exit_code, 1);
  EXPECT_NE(idx.err.find("--class-map applies to ImageFolder"), std::string::npos) << idx.err;
}

TEST_F(DataCli, PrepareThenTrainAndEvalOnThePackedFiles) {
  const fs::path packed = dir_ / "packed";
  const RunResult p = run("prepare --data-dir " + photos_.string() + " --out " + packed.string() +
                          " --max-side 32 --format jpeg -j 2");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  EXPECT_TRUE(fs::is_regular_file(packed / "train.vitpack"));
  EXPECT_TRUE(fs::is_regular_file(packed / "val.vitpack"));
  EXPECT_NE(p.out.find("32 train + 8 val images"), std::string::npos) << p.out;
  EXPECT_NE(p.err.find("broken.jpg"), std::string::npos) << p.err;  // skipped by prepare

  // Mixup/CutMix and RandAugment on the way, to run their wiring in the trainer.
  const RunResult r =
      run(train_flags(packed, "packed", "--mixup 0.8 --cutmix 1.0 --aa rand-m9-mstd0.5-inc1"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Final test top-1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Skipped 0 unreadable images"), std::string::npos) << r.out;
  EXPECT_EQ(slurp(dir_ / "out" / "packed" / "classes.txt"), "cat\ndog\n");
  const RunResult e =
      run("eval --checkpoint " + (dir_ / "out" / "packed" / "last.safetensors").string() +
          " --data-dir " + packed.string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("(8 images)"), std::string::npos) << e.out;

  // Raw format too.
  const fs::path raw = dir_ / "raw";
  ASSERT_EQ(run("prepare --data-dir " + photos_.string() + " --out " + raw.string() +
                " --max-side 0 --format raw")
                .exit_code,
            0);
  const RunResult rr = run(train_flags(raw, "raw"));
  EXPECT_EQ(rr.exit_code, 0) << rr.err;
}

// bench-data into a device's model input (--device: the engine's input stage, the model idle),
// with the augmentation flags, on both paths; its JSON line carries the device side's rate.
TEST_F(DataCli, BenchDataStagesBatchesIntoTheModelInput) {
  const std::string base = "bench-data --data-dir " + photos_.string() +
                           " --img-size 16 -b 4 --batches 3 -j 2 --json --aa 'rand-m9-n3-p1.0-\"q' "
                           "--reprob 0.5 --color-jitter 0.4";
  for (const std::string device : {"cpu", "emu"})
    for (const std::string planned : {"", " --planned"}) {
      const std::string what = device + planned;
      const RunResult r = run(base + " --device " + device + planned);
      ASSERT_EQ(r.exit_code, 0) << what << ": " << r.err;
      const nlohmann::json j = nlohmann::json::parse(r.out);
      EXPECT_EQ(j["device"], device) << what;
      EXPECT_EQ(j["planned"], !planned.empty()) << what;
      EXPECT_EQ(j["aa"], "rand-m9-n3-p1.0-\"q") << what;  // escaped: one valid JSON line
      EXPECT_EQ(j["batch"], 4) << what;
      EXPECT_GT(j["img_per_s"].get<double>(), 0) << what;
      EXPECT_GT(j["device_img_per_s"].get<double>(), 0) << what;
      EXPECT_GT(j["device_ms_per_batch"].get<double>(), 0) << what;
      // Planned batches ship uint8 crops, tables and steps, far fewer than 4-byte floats.
      const double float_bytes = 3 * 16 * 16 * 4;
      if (planned.empty())
        EXPECT_EQ(j["bytes_per_img"].get<double>(), float_bytes) << what;
      else
        EXPECT_LT(j["bytes_per_img"].get<double>(), float_bytes) << what;
    }
  // Without --device: the loader alone, no device fields.
  const RunResult host = run(base);
  ASSERT_EQ(host.exit_code, 0) << host.err;
  EXPECT_FALSE(nlohmann::json::parse(host.out).contains("device"));
  for (const std::string bad : {" --device tpu", " --aa rand-n2.5", " --reprob 2",
                                " --color-jitter -1", " --precision fp8"}) {
    const RunResult r = run(base + bad);
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << bad << ": exit " << r.exit_code;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << bad << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), std::ptrdiff_t(1))
        << bad << ": " << r.err;
  }
}

// A packed file truncated while a run reads it (memory-mapped: SIGBUS) ends the run with one
// error line naming the file and exit 1; the checkpoints written before stay loadable, and the
// run resumes once the file is restored.
TEST_F(DataCli, PackedFileTruncatedMidRunIsOneClearError) {
  const fs::path packed = dir_ / "packed";
  ASSERT_EQ(run("prepare --data-dir " + photos_.string() + " --out " + packed.string() +
                " --max-side 32 --format raw")
                .exit_code,
            0);
  const fs::path file = packed / "train.vitpack", copy = dir_ / "train.vitpack.orig";
  fs::copy_file(file, copy);
  const fs::path err = dir_ / "stderr_sigbus.txt";
  const std::string cmd = std::string(VIT_BINARY) + " " +
                          train_flags(packed, "sigbus", "--epochs 100000") + " > /dev/null 2> " +
                          err.string();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  const fs::path run_dir = dir_ / "out" / "sigbus";
  for (int i = 0; i < 1200 && !fs::exists(run_dir / "state.safetensors"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  fs::resize_file(file, 0);
  int status = 0;
  for (int i = 0; i < 1200 && waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the run went on for 60 s after its data file was truncated";
  }
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  const std::string msg = slurp(err);
  EXPECT_EQ(std::count(msg.begin(), msg.end(), '\n'), 1) << msg;
  EXPECT_EQ(msg.rfind("error: a memory-mapped data file could not be read", 0), 0u) << msg;
  EXPECT_NE(msg.find(file.string()), std::string::npos) << msg;
  const vit::TrainState st = vit::load_train_state((run_dir / "state.safetensors").string());
  fs::copy_file(copy, file, fs::copy_options::overwrite_existing);
  const RunResult resumed = run("train --resume " + run_dir.string() + " --stop-after-updates " +
                                std::to_string(st.step + 1));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.err;
}

// Bad input: exit code 1 or 2, one line on stderr starting "error:".
TEST_F(DataCli, PrepareBadInputIsOneClearError) {
  write_bytes(dir_ / "a_file", {1});
  fs::create_directories(dir_ / "no_splits" / "stuff");
  const std::string d = " --data-dir " + photos_.string();
  const std::string o = " --out " + (dir_ / "p").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"missing data dir", "prepare --data-dir /nonexistent/dir" + o},
      {"no splits", "prepare --data-dir " + (dir_ / "no_splits").string() + o},
      {"bad format", "prepare" + d + o + " --format png"},
      {"bad quality", "prepare" + d + o + " --quality 0"},
      {"bad max side", "prepare" + d + o + " --max-side -5"},
      {"out is a file", "prepare" + d + " --out " + (dir_ / "a_file").string()},
      {"missing out", "prepare" + d},
      {"unknown flag", "prepare" + d + o + " --frobnicate"},
      {"missing class map", "prepare" + d + o + " --class-map /nonexistent.txt"},
  };
  for (const auto& [what, args] : cases) {
    const RunResult r = run(args);
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << what << ": exit " << r.exit_code;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << what << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), std::ptrdiff_t(1))
        << what << ": " << r.err;
  }
  EXPECT_FALSE(fs::exists(dir_ / "p" / "train.vitpack"));
  // Training on a folder with no data set in it names the layouts.
  const RunResult t = run(train_flags(dir_ / "no_splits", "x"));
  EXPECT_EQ(t.exit_code, 1);
  EXPECT_NE(t.err.find("train.vitpack"), std::string::npos) << t.err;
}

}  // namespace
