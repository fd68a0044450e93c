// End-to-end tests of `vitrain train/eval/export` on a small generated IDX data set: bitwise
// resume, checkpoints that survive kill -9, run-folder contents, and one clear error line with
// a non-zero exit for every kind of bad input.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_harness.h"
#include "ops/kernel_options.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using vit::testing::run_vitrain;
using vit::testing::RunResult;

namespace {

// One parsed JSON object a line of `out` (bench --json --variant's lines).
std::vector<nlohmann::json> json_lines(const std::string& out) {
  std::istringstream lines(out);
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

class TrainCli : public vit::testing::CliTest {
 protected:
  // A small model and recipe on the toy data; `extra` appends/overrides flags.
  std::string train_flags(const std::string& experiment, const std::string& extra = "") {
    return "train --data-dir " + data_ + " --model vit_fmnist_tiny --img-size 8 --output " +
           (dir_ / "out").string() + " --experiment " + experiment +
           " -b 32 --epochs 3 --lr 2e-3 --warmup-epochs 1 --log-interval 1 -j 2 --seed 5 " +
           "--drop-path 0.1 --hflip 0 --crop-pad 0 " + extra;
  }

  // Per-update training losses from a run's log.jsonl, keyed by optimizer step.
  std::map<int64_t, double> losses(const std::string& experiment) {
    return vit::testing::train_losses(dir_ / "out" / experiment);
  }
};

TEST_F(TrainCli, RunFolderHasEverything) {
  const RunResult r = run_vitrain(train_flags("full"), dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path run = dir_ / "out" / "full";
  for (const char* f : {"args.yaml", "summary.csv", "log.jsonl", "last.safetensors",
                        "model_best.safetensors", "state.safetensors", "plot.png", "classes.txt"})
    EXPECT_TRUE(fs::is_regular_file(run / f)) << f;
  std::ifstream csv(run / "summary.csv");
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header,
            "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr,img_size,seconds,img_per_s,budget_s,"
            "fraction");
  int rows = 0;
  for (std::string line; std::getline(csv, line);) rows += !line.empty();
  EXPECT_EQ(rows, 3);
  EXPECT_NE(r.out.find("Final test top-1:"), std::string::npos) << r.out;
  // The toy task is easy: the model must learn it.
  const vit::WeightsFile w = vit::load_weights((run / "model_best.safetensors").string());
  EXPECT_GT(std::stod(w.metadata.at("eval_top1")), 60.0);
}

// The default recipe's preset, vit_fmnist_hybrid, carries the conv stem; --stem overrides a
// preset's stem, and no --stem keeps it (args.yaml records the flag as given).
TEST_F(TrainCli, PresetStemAndTheFlagThatOverridesIt) {
  const std::string base = "--model vit_fmnist_hybrid --epochs 1";
  ASSERT_EQ(run_vitrain(train_flags("hybrid", base), dir_.string()).exit_code, 0);
  ASSERT_EQ(
      run_vitrain(train_flags("hybrid_patch", base + " --stem patch"), dir_.string()).exit_code, 0);
  const vit::WeightsFile hybrid =
      vit::load_weights((dir_ / "out" / "hybrid" / "last.safetensors").string());
  const vit::WeightsFile patch =
      vit::load_weights((dir_ / "out" / "hybrid_patch" / "last.safetensors").string());
  EXPECT_EQ(hybrid.cfg.stem, vit::Stem::Conv);
  EXPECT_EQ(hybrid.cfg.stem_widths().size(), 2u);  // P = 4: two 3x3 stride-2 convs
  EXPECT_EQ(patch.cfg.stem, vit::Stem::Patch);
  EXPECT_EQ(patch.cfg.ffn, vit::Ffn::Local);  // the rest of the preset stays
  EXPECT_NE(hybrid.params.size(), patch.params.size());
}

TEST_F(TrainCli, ResumeIsBitwiseIdentical) {
  ASSERT_EQ(run_vitrain(train_flags("straight"), dir_.string()).exit_code, 0);
  // Interrupt mid-epoch (update 21 of 16 per epoch -> epoch 1), then resume to the end.
  const RunResult a = run_vitrain(train_flags("split", "--stop-after-updates 21"), dir_.string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  const RunResult b =
      run_vitrain("train --resume " + (dir_ / "out" / "split").string(), dir_.string());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ref = losses("straight"), got = losses("split");
  ASSERT_EQ(ref.size(), 48u);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [step, loss] : ref) {
    ASSERT_TRUE(got.count(step)) << "step " << step;
    EXPECT_EQ(got.at(step), loss) << "step " << step;  // bitwise
  }
}

TEST_F(TrainCli, CheckpointsSurviveKill9) {
  // Many tiny epochs so checkpoints are written constantly; SIGKILL at varied moments.
  int runs = 0, saved = 0;
  for (int attempt = 0; attempt < 6; ++attempt) {
    const std::string exp = "kill" + std::to_string(attempt);
    const std::string cmd = std::string(VIT_BINARY) + " " +
                            train_flags(exp, "--epochs 200 --log-interval 100") +
                            " > /dev/null 2>&1";
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Wait for the first checkpoint (robust to a loaded machine), then kill at varied moments
    // while later checkpoints are being written.
    const fs::path run = dir_ / "out" / exp;
    for (int i = 0; i < 1200 && !fs::exists(run / "state.safetensors"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + 337 * attempt));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!fs::exists(run)) continue;
    ++runs;
    saved += fs::exists(run / "state.safetensors");
    for (const char* f : {"last.safetensors", "state.safetensors"}) {
      if (!fs::exists(run / f)) continue;  // killed before the first save
      EXPECT_NO_THROW(vit::load_weights((run / f).string())) << exp << "/" << f;
    }
    if (fs::exists(run / "state.safetensors")) {
      EXPECT_NO_THROW(vit::load_train_state((run / "state.safetensors").string())) << exp;
    }
  }
  EXPECT_EQ(saved, 6) << "runs that never checkpointed within 60 s (" << runs << " started)";
}

TEST_F(TrainCli, EvalAndExport) {
  ASSERT_EQ(run_vitrain(train_flags("ev", "--epochs 1"), dir_.string()).exit_code, 0);
  const std::string ckpt = (dir_ / "out" / "ev" / "last.safetensors").string();
  const std::string npy = (dir_ / "logits.npy").string();
  const RunResult e =
      run_vitrain("eval --checkpoint " + ckpt + " --data-dir " + data_ + " --save-logits " + npy,
                  dir_.string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("top-1"), std::string::npos);
  // .npy: header then 128 x 4 float32
  EXPECT_EQ(fs::file_size(npy) % 64, (128u * 4u * 4u) % 64);
  const RunResult x = run_vitrain(
      "export --checkpoint " + ckpt + " --out " + (dir_ / "exp").string(), dir_.string());
  ASSERT_EQ(x.exit_code, 0) << x.err;
  std::ifstream cj(dir_ / "exp" / "config.json");
  const auto cfg = nlohmann::json::parse(cj);
  EXPECT_EQ(cfg.at("num_classes"), 4);
  EXPECT_EQ(cfg.at("model_args").at("embed_dim"), 96);
  EXPECT_TRUE(fs::is_regular_file(dir_ / "exp" / "model.safetensors"));
}

// --fp32-residual end to end on the CPU bf16 emulation: the run says which backend trained, its
// args.yaml keeps the flag, and eval takes it too (the same numerics as the run's own eval).
TEST_F(TrainCli, Fp32ResidualTrainsAndEvaluatesOnTheEmulation) {
  const RunResult t =
      run_vitrain(train_flags("fr", "--epochs 1 --device emu --fp32-residual"), dir_.string());
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("Device: cpu bf16 emulation, fp32 residual"), std::string::npos) << t.out;
  std::ifstream args(dir_ / "out" / "fr" / "args.yaml");
  const std::string yaml((std::istreambuf_iterator<char>(args)), {});
  EXPECT_NE(yaml.find("fp32_residual: true"), std::string::npos) << yaml;
  const std::string ckpt = (dir_ / "out" / "fr" / "last.safetensors").string();
  const RunResult e =
      run_vitrain("eval --device emu --fp32-residual --checkpoint " + ckpt + " --data-dir " + data_,
                  dir_.string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.out.find("fp32 residual"), std::string::npos) << e.out;
}

// --cuda-graph (on by default) asks the GPU engine to replay its passes; on the CPU it is kept
// (a recipe that sets it still trains on a machine without a GPU) and changes nothing: the
// same bits as --cuda-graph=false.
TEST_F(TrainCli, CudaGraphIsKeptAndChangesNothingOnTheCpu) {
  const RunResult plain =
      run_vitrain(train_flags("ng", "--epochs 1 --device cpu --cuda-graph=false"), dir_.string());
  const RunResult t = run_vitrain(train_flags("cg", "--epochs 1 --device cpu"), dir_.string());
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_EQ(t.out.find("CUDA graphs"), std::string::npos) << t.out;  // none on the CPU
  auto yaml_of = [&](const char* run) {
    std::ifstream args(dir_ / "out" / run / "args.yaml");
    return std::string((std::istreambuf_iterator<char>(args)), {});
  };
  EXPECT_NE(yaml_of("cg").find("cuda_graph: true"), std::string::npos) << yaml_of("cg");
  EXPECT_NE(yaml_of("ng").find("cuda_graph: false"), std::string::npos) << yaml_of("ng");
  auto bytes = [&](const char* run) {
    std::ifstream in(dir_ / "out" / run / "last.safetensors", std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  EXPECT_EQ(bytes("cg"), bytes("ng"));
}

// Every bad input: exit code 1 (not a crash/abort), one line on stderr starting "error:".
// vitrain limits how long idle OpenMP threads spin (core/omp_wait.h) unless the user chose:
// `bench --json` reports the GOMP_SPINCOUNT the process started with (its /proc environ, so a
// setenv without the restart would show as "unset"). Started by the dynamic loader as a
// program, it cannot restart and keeps the library's default.
TEST_F(TrainCli, OpenMpSpinningIsLimitedUnlessTheUserChose) {
  const std::string bench = "bench --model vit_fmnist_tiny -b 4 --steps 1 --warmup 0 --json";
  const auto spin = [&](const std::string& env) {
    const RunResult r = run_vitrain(bench, dir_.string(), env);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out).value("omp_spin", std::string("missing"));
  };
  EXPECT_EQ(spin("-u GOMP_SPINCOUNT -u OMP_WAIT_POLICY"), "1000");
  EXPECT_EQ(spin("-u OMP_WAIT_POLICY GOMP_SPINCOUNT=20000"), "20000");
  EXPECT_EQ(spin("-u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive"), "unset");
  const char* loader = "/lib64/ld-linux-x86-64.so.2";  // x86-64 glibc's
  if (fs::exists(loader)) {
    EXPECT_EQ(spin(std::string("-u GOMP_SPINCOUNT -u OMP_WAIT_POLICY ") + loader), "unset");
  }
}

// bench times its steps in up to 5 chunks, each closed by a wait for the device: the JSON gives
// each chunk's rate (7 steps: chunks of 2, 2, 1, 1, 1), their median, and the whole run's rate,
// which the chunks' rates bracket (it is their step-weighted harmonic mean).
TEST_F(TrainCli, BenchReportsTheRateOfEachChunkOfItsSteps) {
  const RunResult r =
      run_vitrain("bench --model vit_fmnist_tiny -b 2 --steps 7 --warmup 0 --json", dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.contains("chunk_img_per_s")) << r.out;
  std::vector<double> rates = j["chunk_img_per_s"].get<std::vector<double>>();
  ASSERT_EQ(rates.size(), 5u) << r.out;
  std::sort(rates.begin(), rates.end());
  EXPECT_GT(rates.front(), 0.0);
  EXPECT_EQ(j.value("median_img_per_s", -1.0), rates[2]);
  // All rates are printed to 0.01 img/s: bracket the whole rate within that rounding.
  EXPECT_GE(j.value("img_per_s", -1.0), rates.front() - 0.01) << r.out;
  EXPECT_LE(j.value("img_per_s", -1.0), rates.back() + 0.01) << r.out;
  const nlohmann::json one = nlohmann::json::parse(
      run_vitrain("bench --model vit_fmnist_tiny -b 2 --steps 1 --warmup 0 --json", dir_.string())
          .out);
  EXPECT_EQ(one["chunk_img_per_s"].size(), 1u);
}

// bench --variant times kernel-plan presets against each other in one process: a JSON line a
// variant, in the order given, with one rate a round, their median, its options and resolved
// plan, and its median over the first's (the first's is 1). A malformed spec is one error line.
TEST_F(TrainCli, BenchTimesVariantsInInterleavedRounds) {
  const RunResult r = run_vitrain(
      "bench --model vit_fmnist_tiny -b 2 --steps 2 --warmup 1 --json --rounds 3 --device emu "
      "--variant default: --variant unfused:attention=unfused,flash_warps=2",
      dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<nlohmann::json> rows = json_lines(r.out);
  ASSERT_EQ(rows.size(), 2u) << r.out;
  EXPECT_EQ(rows[0].value("variant", ""), "default");
  EXPECT_EQ(rows[1].value("variant", ""), "unfused");
  EXPECT_EQ(rows[0]["kernels"].value("options", ""), vit::to_string(vit::KernelOptions{}));
  EXPECT_NE(rows[1]["kernels"].value("options", "").find("attention=unfused"), std::string::npos);
  // The plan says what each ran: the emulation fuses attention by default, not when told not to.
  const auto attention_of = [](const nlohmann::json& row) {
    for (const auto& e : row["kernels"]["plan"])
      if (e.value("op", "") == "attention") return e.value("variant", "");
    return std::string("none");
  };
  EXPECT_EQ(attention_of(rows[0]), "flash");
  EXPECT_EQ(attention_of(rows[1]), "unfused");
  for (const nlohmann::json& row : rows) {
    std::vector<double> rates = row["img_per_s_rounds"].get<std::vector<double>>();
    ASSERT_EQ(rates.size(), 3u) << row;
    std::sort(rates.begin(), rates.end());
    EXPECT_GT(rates.front(), 0.0);
    EXPECT_NEAR(row.value("median_img_per_s", -1.0), rates[1], 0.01) << row;
  }
  EXPECT_EQ(rows[0].value("ratio_to_first", -1.0), 1.0);
  EXPECT_NEAR(rows[1].value("ratio_to_first", -1.0),
              rows[1].value("median_img_per_s", 0.0) / rows[0].value("median_img_per_s", 1.0),
              1e-3);
  const RunResult bad =
      run_vitrain("bench --model vit_fmnist_tiny --variant a:VIT_X=1", dir_.string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("error: bench: --variant 'a:VIT_X=1': --kernels: unknown key 'VIT_X'"),
            std::string::npos)
      << bad.err;
}

// A variant whose run throws (a new kernel's first failure) is left out of the later rounds and
// its line says why, while the others are timed in every round: the exit code is 1, and every
// variant still has its line. VIT_TEST_BENCH_VARIANT_FAILS names the variant that fails.
TEST_F(TrainCli, BenchGoesOnPastAFailingVariant) {
  const RunResult r = run_vitrain(
      "bench --model vit_fmnist_tiny -b 2 --steps 1 --warmup 1 --json --rounds 2 "
      "--variant a: --variant b:gelu=fast --variant c:",
      dir_.string(), "VIT_TEST_BENCH_VARIANT_FAILS=b");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("error: bench: variant b failed: VIT_TEST_BENCH_VARIANT_FAILS names it"),
            std::string::npos)
      << r.err;
  const std::vector<nlohmann::json> rows = json_lines(r.out);
  ASSERT_EQ(rows.size(), 3u) << r.out;
  for (const size_t i : {size_t(0), size_t(2)}) {
    EXPECT_EQ(rows[i]["img_per_s_rounds"].size(), 2u) << rows[i];
    EXPECT_FALSE(rows[i].contains("error")) << rows[i];
    EXPECT_TRUE(rows[i].contains("ratio_to_first")) << rows[i];
  }
  EXPECT_EQ(rows[1].value("variant", ""), "b");
  EXPECT_TRUE(rows[1]["img_per_s_rounds"].empty()) << rows[1];
  EXPECT_FALSE(rows[1].contains("median_img_per_s")) << rows[1];
  EXPECT_NE(rows[1].value("error", "").find("VIT_TEST_BENCH_VARIANT_FAILS"), std::string::npos)
      << rows[1];
}

// bench replays CUDA graphs by default, as train does, and the op profile times op by op: with
// --profile the default gives way, an explicit --cuda-graph is one clear error, and
// --no-cuda-graph / --cuda-graph=false are accepted. On the CPU the JSON has no graph count.
TEST_F(TrainCli, BenchGraphsGiveWayToTheProfileUnlessAskedFor) {
  const std::string bench = "bench --model vit_fmnist_tiny -b 2 --steps 1 --warmup 0 --json ";
  for (const char* flags : {"", "--profile", "--profile --no-cuda-graph", "--cuda-graph=false"}) {
    SCOPED_TRACE(flags);
    const RunResult r = run_vitrain(bench + flags, dir_.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(nlohmann::json::parse(r.out).contains("graph_replays")) << r.out;
  }
  const RunResult both = run_vitrain(bench + "--profile --cuda-graph", dir_.string());
  EXPECT_EQ(both.exit_code, 1);
  EXPECT_NE(both.err.find("error: bench: --cuda-graph and the op profile"), std::string::npos)
      << both.err;
}

// bench builds the architecture it is told (the locality FFN or the tanh GELU, the classifier)
// over the preset: the JSON names them, and the parameter state follows (the local FFN has a
// depthwise kernel and no fc biases; mlp_tanh has mlp's). A value outside the choices is one
// clear error.
TEST_F(TrainCli, BenchTakesTheFfnAndClassifierOfTheModel) {
  const auto bench = [&](const std::string& flags) {
    const RunResult r = run_vitrain(
        "bench --model vit_fmnist_tiny -b 2 --steps 1 --warmup 0 --json " + flags, dir_.string());
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json preset = bench(""), local = bench("--ffn local --gp token");
  EXPECT_EQ(preset.value("ffn", ""), "mlp");
  EXPECT_EQ(preset.value("gp", ""), "avg");
  EXPECT_EQ(local.value("ffn", ""), "local");
  EXPECT_EQ(local.value("gp", ""), "token");
  EXPECT_NE(local.value("state_mib", 0.0), preset.value("state_mib", 0.0));
  const nlohmann::json tanh_gelu = bench("--ffn mlp_tanh");  // the same parameters as mlp
  EXPECT_EQ(tanh_gelu.value("ffn", ""), "mlp_tanh");
  EXPECT_EQ(tanh_gelu.value("state_mib", 0.0), preset.value("state_mib", 0.0));
  const RunResult bad = run_vitrain("bench --model vit_fmnist_tiny --ffn conv", dir_.string());
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  EXPECT_EQ(bad.err.rfind("error:", 0), 0u) << bad.err;
}

TEST_F(TrainCli, BadInputsGiveOneClearError) {
  ASSERT_EQ(run_vitrain(train_flags("ok", "--epochs 1"), dir_.string()).exit_code, 0);
  const std::string ckpt = (dir_ / "out" / "ok" / "last.safetensors").string();
  // Truncated and garbage checkpoints.
  {
    std::ifstream in(ckpt, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream((dir_ / "trunc.safetensors").string(), std::ios::binary)
        << bytes.substr(0, bytes.size() / 2);
    std::ofstream((dir_ / "garbage.safetensors").string(), std::ios::binary) << "not a file";
  }
  // A corrupt data directory: truncated gzip of the training images.
  const std::string bad_data = (dir_ / "bad_data").string();
  fs::create_directories(bad_data);
  for (const auto& e : fs::directory_iterator(data_)) fs::copy(e.path(), bad_data);
  fs::resize_file(bad_data + "/train-images-idx3-ubyte.gz", 100);
  std::ofstream((dir_ / "typo.yaml").string()) << "batch_sise: 32\n";
  std::ofstream((dir_ / "badtype.yaml").string()) << "epochs: many\n";

  const std::vector<std::pair<std::string, std::string>> cases = {
      {"missing data dir", "train --data-dir /nonexistent/dir"},
      {"corrupt data", "train --data-dir " + bad_data},
      {"unknown model", train_flags("x1", "--model vit_gigantic")},
      {"img size not divisible", train_flags("x2", "--img-size 10")},
      {"unknown flag", train_flags("x3", "--no-such-flag")},
      {"bad value", train_flags("x4", "--lr -1")},
      {"config typo", train_flags("x5", "-c " + (dir_ / "typo.yaml").string())},
      {"config bad type", train_flags("x6", "-c " + (dir_ / "badtype.yaml").string())},
      {"missing config", train_flags("x7", "-c /nonexistent.yaml")},
      {"resume nothing", "train --resume /nonexistent/run"},
      {"truncated checkpoint",
       "eval --data-dir " + data_ + " --checkpoint " + (dir_ / "trunc.safetensors").string()},
      {"garbage checkpoint",
       "eval --data-dir " + data_ + " --checkpoint " + (dir_ / "garbage.safetensors").string()},
      {"missing checkpoint", "eval --data-dir " + data_ + " --checkpoint /nonexistent.st"},
      {"bad initial checkpoint",
       train_flags("x8", "--initial-checkpoint " + (dir_ / "trunc.safetensors").string())},
      {"unknown command", "frobnicate"},
      {"bad kernel option", train_flags("x9", "--kernels attention=fastest")},
      {"unknown kernel key", "bench --model vit_fmnist_tiny --kernels warps=2"},
      {"eval kernel option",
       "eval --data-dir " + data_ + " --checkpoint " + ckpt + " --kernels gelu=tanh"},
  };
  for (const auto& [what, args] : cases) {
    const RunResult r = run_vitrain(args, dir_.string());
    EXPECT_TRUE(r.exit_code == 1 || r.exit_code == 2) << what << ": exit " << r.exit_code;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << what << ": " << r.err;
    const size_t lines = std::count(r.err.begin(), r.err.end(), '\n');
    EXPECT_LE(lines, what == std::string("unknown command") ? 10u : 1u) << what << ": " << r.err;
  }
  // A path that does not exist is named as given (it once read "'/nonexistent' is not a run
  // folder": the parent of what was typed).
  const RunResult r = run_vitrain("train --resume /nonexistent/run", dir_.string());
  EXPECT_NE(r.err.find("'/nonexistent/run' does not exist"), std::string::npos) << r.err;
}

// --device cuda: on a machine without a usable GPU, one clear error line and exit code 1; where
// a GPU is usable the same command trains on it.
TEST_F(TrainCli, DeviceCudaTrainsOrGivesOneClearError) {
  const RunResult r = run_vitrain(train_flags("cuda", "--epochs 1 --device cuda"), dir_.string());
  if (r.exit_code == 0) {
    EXPECT_NE(r.out.find("Device: cuda"), std::string::npos) << r.out;
    return;
  }
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.rfind("error: --device cuda: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  // auto falls back to the CPU there.
  const RunResult a = run_vitrain(train_flags("auto", "--epochs 1 --device auto"), dir_.string());
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_NE(a.out.find("Device: cpu"), std::string::npos) << a.out;
}

// The CPU bf16 emulation through the whole trainer: it learns the toy task, and resume is
// bitwise (the bf16 weight copy is rebuilt from the fp32 master weights in the state file).
TEST_F(TrainCli, Bf16EmulationLearnsAndResumesBitwise) {
  const std::string emu = "--device emu --epochs 2";
  const RunResult s = run_vitrain(train_flags("emu", emu), dir_.string());
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("Device: cpu bf16 emulation"), std::string::npos) << s.out;
  const vit::WeightsFile w =
      vit::load_weights((dir_ / "out" / "emu" / "model_best.safetensors").string());
  EXPECT_GT(std::stod(w.metadata.at("eval_top1")), 50.0);
  ASSERT_EQ(run_vitrain(train_flags("emu_split", emu + " --stop-after-updates 21"), dir_.string())
                .exit_code,
            0);
  const RunResult b =
      run_vitrain("train --resume " + (dir_ / "out" / "emu_split").string(), dir_.string());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ref = losses("emu"), got = losses("emu_split");
  ASSERT_EQ(ref.size(), 32u);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [step, loss] : ref) EXPECT_EQ(got.at(step), loss) << "step " << step;
}

// The run folder records the kernel plan (kernels.json, named by log.jsonl's first record); a
// resumed run replays it whatever the autotune cache or the same-bits options say then, and
// stays bitwise; a resume that would change results (another GELU) is one error line that
// leaves the run as it was.
TEST_F(TrainCli, KernelPlanIsRecordedAndReplayedOnResume) {
  const std::string emu = "--device emu --epochs 2";
  const std::string cache_a = "XDG_CACHE_HOME=" + (dir_ / "cache_a").string();
  const std::string cache_b = "XDG_CACHE_HOME=" + (dir_ / "cache_b").string();
  ASSERT_EQ(run_vitrain(train_flags("k_straight", emu), dir_.string(), cache_a).exit_code, 0);
  ASSERT_EQ(run_vitrain(train_flags("k_split", emu + " --stop-after-updates 21"), dir_.string(),
                        cache_a)
                .exit_code,
            0);
  const fs::path run = dir_ / "out" / "k_split";
  std::ifstream log(run / "log.jsonl");
  std::string first;
  std::getline(log, first);
  const auto record = nlohmann::json::parse(first);
  EXPECT_EQ(record.value("type", ""), "kernels") << first;
  EXPECT_EQ(record.value("file", ""), "kernels.json") << first;
  const auto plan_of = [&] {
    std::ifstream f(run / "kernels.json");
    return nlohmann::json::parse(f);
  };
  const nlohmann::json before = plan_of();
  EXPECT_EQ(before.value("options", ""), vit::to_string(vit::KernelOptions{}));
  std::map<std::string, std::string> variant_of;  // "op shape" -> variant
  for (const auto& e : before["plan"]) {
    EXPECT_EQ(e.value("why", ""), "rule") << e;
    variant_of[e.value("op", "") + " " + e.value("shape", "")] = e.value("variant", "");
  }
  EXPECT_EQ(variant_of.count("attention B=32 N=4 H=3 D=32 bf16"), 1u) << before.dump();

  const RunResult refused = run_vitrain(
      "train --resume " + run.string() + " --kernels gelu=fast", dir_.string(), cache_a);
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find("the run was trained with other kernels (gelu: erf -> fast)"),
            std::string::npos)
      << refused.err;
  EXPECT_EQ(plan_of(), before) << "a refused resume rewrote kernels.json";

  const RunResult resumed =
      run_vitrain("train --resume " + run.string() + " --kernels autotune=on,flash_warps=3",
                  dir_.string(), cache_b);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  const auto ref = losses("k_straight"), got = losses("k_split");
  ASSERT_EQ(ref.size(), 32u);
  ASSERT_EQ(got.size(), ref.size());
  for (const auto& [step, loss] : ref) EXPECT_EQ(got.at(step), loss) << "step " << step;
  // The recorded picks stand (the forced height did not replace them).
  const nlohmann::json after = plan_of();
  for (const auto& e : after["plan"]) {
    const std::string key = e.value("op", "") + " " + e.value("shape", "");
    if (!variant_of.count(key)) continue;
    EXPECT_EQ(e.value("why", ""), "recorded") << e;
    EXPECT_EQ(e.value("variant", ""), variant_of.at(key)) << e;
    EXPECT_EQ(e.value("param", -1), 0) << e;
  }
}

// The non-finite guard end to end, by injection (VIT_TEST_NONFINITE_UPDATES gives the listed
// updates NaN gradients). A few bad updates are skipped, counted and logged, and the run learns;
// a resume in the middle of them is bitwise. max_bad_steps in a row end the run with one error
// line, writing nothing: the state of the last epoch end resumes.
TEST_F(TrainCli, NonFiniteUpdatesAreSkippedAndTooManyStopTheRun) {
  struct Inject {
    Inject(const char* updates) { setenv("VIT_TEST_NONFINITE_UPDATES", updates, 1); }
    ~Inject() { unsetenv("VIT_TEST_NONFINITE_UPDATES"); }
  };
  const fs::path out = dir_ / "out";
  {
    Inject inject("5,20-22");
    const RunResult r = run_vitrain(train_flags("skips"), dir_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("warning: 1 update skipped for a non-finite loss or gradient norm (up to "
                         "epoch 0 update 5; 1 in this run, 10 in a row stop it)"),
              std::string::npos)
        << r.out;
    const auto skips = vit::testing::read_log(out / "skips", "skip");
    ASSERT_EQ(skips.size(), 4u);  // the CPU engine is read after every update
    EXPECT_EQ(skips.back().at("step").get<int64_t>(), 22);
    EXPECT_EQ(skips.back().at("skipped_steps").get<int64_t>(), 4);
    const auto train = vit::testing::read_log(out / "skips", "train");
    ASSERT_EQ(train.size(), 48u);
    EXPECT_TRUE(train[4].at("grad_norm").is_null());  // NaN is written as null
    EXPECT_TRUE(train[4].at("loss").is_number());     // (the loss itself was finite)
    EXPECT_EQ(train.back().at("skipped_steps").get<int64_t>(), 4);
    EXPECT_TRUE(train.back().at("loss_avg").is_number());
    const vit::WeightsFile w =
        vit::load_weights((out / "skips" / "model_best.safetensors").string());
    EXPECT_GT(std::stod(w.metadata.at("eval_top1")), 60.0);

    ASSERT_EQ(
        run_vitrain(train_flags("skips_split", "--stop-after-updates 21"), dir_.string()).exit_code,
        0);
    const RunResult b =
        run_vitrain("train --resume " + (out / "skips_split").string(), dir_.string());
    ASSERT_EQ(b.exit_code, 0) << b.err;
    EXPECT_EQ(vit::load_weights((out / "skips_split" / "last.safetensors").string()).params,
              vit::load_weights((out / "skips" / "last.safetensors").string()).params);
  }
  {
    Inject inject("20-48");
    const RunResult r = run_vitrain(train_flags("diverged", "--max-bad-steps 3"), dir_.string());
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find("3 updates in a row had a non-finite loss or gradient norm (the last at "
                         "epoch 1 update 6): training diverged"),
              std::string::npos)
        << r.err;
    const vit::TrainState st =
        vit::load_train_state((out / "diverged" / "state.safetensors").string());
    EXPECT_EQ(st.step, 16);  // written at the end of epoch 0, nothing after
    EXPECT_EQ(st.skipped_steps, 0);
  }
  const RunResult c = run_vitrain("train --resume " + (out / "diverged").string(), dir_.string());
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(losses("diverged").size(), 48u);
}

// --model-ema end to end: both weights are evaluated every epoch, the EMA's metric is the run's
// (summary, model_best), last_ema.safetensors evaluates to the logged EMA top-1 and exports, and
// a resume in the middle of the run continues the EMA bitwise.
TEST_F(TrainCli, ModelEmaIsEvaluatedSavedAndResumedBitwise) {
  const std::string ema = "--model-ema --model-ema-decay 0.9";
  const RunResult r = run_vitrain(train_flags("ema", ema), dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  size_t ema_lines = 0;
  for (size_t at = r.out.find("Test EMA: "); at != std::string::npos;
       at = r.out.find("Test EMA: ", at + 1))
    ++ema_lines;
  EXPECT_EQ(ema_lines, 3u) << r.out;
  const fs::path run = dir_ / "out" / "ema";
  const auto evals = vit::testing::read_log(run, "eval");
  ASSERT_EQ(evals.size(), 3u);
  EXPECT_TRUE(evals.back().at("ema").get<bool>());
  EXPECT_TRUE(evals.back().at("raw_eval_top1").is_number());
  const double ema_top1 = evals.back().at("eval_top1").get<double>();
  EXPECT_GT(ema_top1, 60.0);
  const vit::WeightsFile best = vit::load_weights((run / "model_best.safetensors").string());
  EXPECT_EQ(best.metadata.at("weights"), "ema");
  const vit::WeightsFile last_ema = vit::load_weights((run / "last_ema.safetensors").string());
  EXPECT_NE(last_ema.params, vit::load_weights((run / "last.safetensors").string()).params);

  const RunResult e = run_vitrain(
      "eval --checkpoint " + (run / "last_ema.safetensors").string() + " --data-dir " + data_,
      dir_.string());
  ASSERT_EQ(e.exit_code, 0) << e.err;
  const size_t at = e.out.find("top-1 ");
  ASSERT_NE(at, std::string::npos) << e.out;
  EXPECT_NEAR(std::stod(e.out.substr(at + 6)), ema_top1, 0.01) << e.out;
  const RunResult x = run_vitrain("export --checkpoint " + (run / "last_ema.safetensors").string() +
                                      " --out " + (dir_ / "exp_ema").string(),
                                  dir_.string());
  ASSERT_EQ(x.exit_code, 0) << x.err;
  EXPECT_TRUE(fs::is_regular_file(dir_ / "exp_ema" / "model.safetensors"));

  ASSERT_EQ(run_vitrain(train_flags("ema_split", ema + " --stop-after-updates 21"), dir_.string())
                .exit_code,
            0);
  const RunResult b =
      run_vitrain("train --resume " + (dir_ / "out" / "ema_split").string(), dir_.string());
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(
      vit::load_weights((dir_ / "out" / "ema_split" / "last_ema.safetensors").string()).params,
      last_ema.params);
  EXPECT_EQ(losses("ema_split"), losses("ema"));
}

}  // namespace
