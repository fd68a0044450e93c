// Data-parallel training under mpirun (OpenMPI, on the CPU): 2 and 3 ranks train the same run as
// one rank with the same global batch (losses and weights within 1e-5 relative), a checkpoint
// written by 2 ranks resumes on 1 and on 3, only rank 0 writes, and a batch the ranks cannot
// share is one clear error. Skips where this build has no MPI or mpirun is missing.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "cli_harness.h"
#include "data/decode.h"
#include "data/image.h"
#include "dist/comm.h"
#include "model/params.h"
#include "train/checkpoint.h"

namespace fs = std::filesystem;
using vit::Index;
using vit::testing::RunResult;

namespace {

// The pid of the process that OpenMPI started as `rank` of a job whose command line holds
// `marker`, or -1.
pid_t find_rank(int rank, const std::string& marker) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (const auto& d : fs::directory_iterator("/proc")) {
    const std::string name = d.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = vit::testing::slurp(d.path() / "cmdline");  // NUL-separated
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(marker) == std::string::npos || cmdline.rfind("mpirun", 0) == 0) continue;
    std::string env = vit::testing::slurp(d.path() / "environ");
    for (char& c : env)
      if (c == '\0') c = '\n';
    if (("\n" + env + "\n").find("\n" + want + "\n") != std::string::npos)
      return pid_t(std::stol(name));
  }
  return -1;
}

// Runs `vitrain ARGS` on `ranks` ranks through mpirun (1: without mpirun).
RunResult run_ranks(int ranks, const std::string& args, const std::string& dir) {
  if (ranks == 1) return vit::testing::run_vitrain(args, dir);
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  // --oversubscribe: more ranks than cores (CI has 2); one thread per rank (-j 1 in the flags).
  // ASan builds (scripts/sanitize.sh): OpenMPI's own allocations at exit are not ours.
  const std::string cmd = "mpirun -np " + std::to_string(ranks) +
                          " --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 " + VIT_BINARY + " " +
                          args + " > " + out + " 2> " + err + " < /dev/null";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = vit::testing::slurp(out);
  r.err = vit::testing::slurp(err);
  return r;
}

class DistCli : public vit::testing::CliTest {
 protected:
  void SetUp() override {
    if (!vit::mpi_available()) GTEST_SKIP() << "this build has no MPI (libopenmpi-dev)";
    if (std::system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "no mpirun";
    // CI runs as root; OpenMPI refuses that unless told. The shared-memory transport's
    // single-copy mechanism needs ptrace rights that containers often lack.
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    CliTest::SetUp();
  }

  // Global batch 48 splits over 1, 2 and 3 ranks; 512 / 48 = 10 updates an epoch. No drop path
  // or mixup: their per-sample randomness depends on the rank layout.
  std::string flags(const std::string& experiment, const std::string& extra = "") {
    return "train --data-dir " + data_ + " --model vit_fmnist_tiny --img-size 8 --output " +
           (dir_ / "out").string() + " --experiment " + experiment +
           " -b 48 --epochs 3 --lr 2e-3 --warmup-epochs 1 --log-interval 1 -j 1 --seed 5 " +
           "--hflip 0 --crop-pad 0 " + extra;
  }

  std::map<int64_t, double> losses(const std::string& experiment) {
    return vit::testing::train_losses(dir_ / "out" / experiment);
  }

  void expect_same_losses(const std::string& got, const std::string& ref, size_t n) {
    const auto a = losses(ref), b = losses(got);
    ASSERT_EQ(a.size(), n);
    ASSERT_EQ(b.size(), a.size());
    for (const auto& [step, loss] : a) {
      ASSERT_TRUE(b.count(step)) << "step " << step;
      EXPECT_NEAR(b.at(step), loss, 1e-5 * std::fabs(loss)) << got << " step " << step;
    }
  }

  // Per tensor, max |a - b| / max |a| <= 1e-5 over the final weights. The key third of each
  // qkv bias is left out: its gradient is zero in exact arithmetic (softmax ignores a constant
  // added to every key), so AdamW's lr g / (|g| + eps) turns the rounding noise of either run
  // into steps of up to lr there (tests/engine_test_util.h; 3e-3 measured here).
  void expect_same_weights(const std::string& got, const std::string& ref) {
    const auto a = vit::load_weights((dir_ / "out" / ref / "last.safetensors").string());
    const auto b = vit::load_weights((dir_ / "out" / got / "last.safetensors").string());
    ASSERT_EQ(a.params.size(), b.params.size());
    const Index C = a.cfg.embed_dim;
    const vit::ParamTable table = vit::build_param_table(a.cfg);
    for (const auto& spec : table.specs) {
      const bool qkv_bias = spec.name.find("attn.qkv.bias") != std::string::npos;
      double err = 0, scale = 1e-30;
      for (Index i = spec.offset; i < spec.offset + spec.numel(); ++i) {
        if (qkv_bias && i >= spec.offset + C && i < spec.offset + 2 * C) continue;
        err = std::max(err, double(std::fabs(a.params[i] - b.params[i])));
        scale = std::max(scale, double(std::fabs(a.params[i])));
      }
      EXPECT_LE(err / scale, 1e-5) << got << ": " << spec.name;
    }
  }
};

TEST_F(DistCli, TwoAndThreeRanksTrainTheOneRankRun) {
  const RunResult one = run_ranks(1, flags("r1"), dir_.string());
  ASSERT_EQ(one.exit_code, 0) << one.err;
  for (int ranks : {2, 3}) {
    const std::string e = "r" + std::to_string(ranks);
    const RunResult r = run_ranks(ranks, flags(e), dir_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("Data parallel: " + std::to_string(ranks) + " ranks (mpi)"),
              std::string::npos)
        << r.out;
    expect_same_losses(e, "r1", 30);
    expect_same_weights(e, "r1");
    // Rank 0 alone wrote: one run folder per run, and the eval rows agree.
    const auto ev1 = vit::testing::read_log(dir_ / "out" / "r1", "eval");
    const auto evn = vit::testing::read_log(dir_ / "out" / e, "eval");
    ASSERT_EQ(evn.size(), ev1.size());
    // Eval is split over the ranks (batches r, r + W, ...) and summed: the same counts, the
    // loss up to the order of its sum.
    EXPECT_NEAR(evn.back().at("eval_top1").get<double>(), ev1.back().at("eval_top1").get<double>(),
                1e-9);
    const double l1 = ev1.back().at("eval_loss").get<double>();
    EXPECT_NEAR(evn.back().at("eval_loss").get<double>(), l1, 1e-5 * l1);
  }
  size_t folders = 0;
  for ([[maybe_unused]] const auto& d : fs::directory_iterator(dir_ / "out")) ++folders;
  EXPECT_EQ(folders, 3u);
}

// With gradient accumulation: the sums run in the last micro-batch's backward pass only
// (overlapped with it, tests/test_grad_buckets.cpp), and the run is still the one-rank run.
TEST_F(DistCli, AccumulatedMicroBatchesTrainTheOneRankRun) {
  const RunResult one = run_ranks(1, flags("a1", "--grad-accum-steps 2"), dir_.string());
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const RunResult two = run_ranks(2, flags("a2", "--grad-accum-steps 2"), dir_.string());
  ASSERT_EQ(two.exit_code, 0) << two.err;
  expect_same_losses("a2", "a1", 15);  // updates of 2 x 48 samples: 5 an epoch
  expect_same_weights("a2", "a1");
}

TEST_F(DistCli, TwoRankCheckpointResumesOnOneAndOnThreeRanks) {
  ASSERT_EQ(run_ranks(1, flags("straight"), dir_.string()).exit_code, 0);
  for (int ranks : {1, 3}) {
    const std::string e = "from2_on" + std::to_string(ranks);
    const RunResult a = run_ranks(2, flags(e, "--stop-after-updates 14"), dir_.string());
    ASSERT_EQ(a.exit_code, 0) << a.err;
    const RunResult b =
        run_ranks(ranks, "train --resume " + (dir_ / "out" / e).string(), dir_.string());
    ASSERT_EQ(b.exit_code, 0) << b.err;
    expect_same_losses(e, "straight", 30);
    expect_same_weights(e, "straight");
  }
}

// The MiB of AdamW moments in the header's "Training state per rank" line (-1 if none).
double moments_mib(const std::string& out) {
  const std::string key = "AdamW moments ";
  const size_t at = out.find(key);
  return at == std::string::npos ? -1.0 : std::atof(out.c_str() + at + key.size());
}

// ZeRO-1: the same run as one rank, unsharded; and its checkpoint (full moments, gathered from
// the ranks' blocks) resumes unsharded on one rank and sharded on three.

TEST_F(DistCli, ShardedOptimizerTrainsTheOneRankRunAndResumesAnywhere) {
  const RunResult one = run_ranks(1, flags("r1"), dir_.string());
  ASSERT_EQ(one.exit_code, 0) << one.err;
  const double whole_mib = moments_mib(one.out);
  ASSERT_GT(whole_mib, 0) << one.out;
  for (int ranks : {2, 3}) {
    const std::string e = "zero" + std::to_string(ranks);
    const RunResult r = run_ranks(ranks, flags(e, "--shard-optimizer"), dir_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("sharded optimizer (ZeRO-1)"), std::string::npos) << r.out;
    // Each rank holds its block of the moments (the largest block, rounded to 0.1 MiB).
    EXPECT_NE(r.out.find("(ZeRO-1: 1/" + std::to_string(ranks) + ")"), std::string::npos) << r.out;
    EXPECT_NEAR(moments_mib(r.out), whole_mib / ranks, 0.1) << r.out;
    expect_same_losses(e, "r1", 30);
    expect_same_weights(e, "r1");
  }
  const std::vector<std::pair<int, std::string>> resumes = {{1, ""}, {3, " --shard-optimizer"}};
  for (const auto& [ranks, extra] : resumes) {
    const std::string e = "zero2_on" + std::to_string(ranks);
    const RunResult a =
        run_ranks(2, flags(e, "--shard-optimizer --stop-after-updates 14"), dir_.string());
    ASSERT_EQ(a.exit_code, 0) << a.err;
    const RunResult b =
        run_ranks(ranks, "train --resume " + (dir_ / "out" / e).string() + extra, dir_.string());
    ASSERT_EQ(b.exit_code, 0) << b.err;
    expect_same_losses(e, "r1", 30);
    expect_same_weights(e, "r1");
  }
}

// --budget under data parallel: every rank stops at rank 0's verdict and runs the schedules on
// rank 0's clock. Rank 1's clock is set 1000 s ahead, past the whole budget: on its own clock it
// would stop before its first update and leave rank 0 alone in the gradient sum, and its size
// curriculum would train at the final size (its weights' shapes differ: the sum fails).
TEST_F(DistCli, BudgetRunsOnRankZerosClock) {
  setenv("VIT_TEST_CLOCK_SKEW_S", "1000", 1);
  const RunResult r = run_ranks(
      2, flags("budget", "--budget 10s --dist-timeout 30 --curriculum size --init-size 4"),
      dir_.string());
  unsetenv("VIT_TEST_CLOCK_SKEW_S");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Budget: stopped"), std::string::npos) << r.out;
  const auto train = vit::testing::read_log(dir_ / "out" / "budget", "train");
  ASSERT_GT(train.size(), 30u);  // past --epochs 3 (10 updates each): the budget ended it
  const auto evals = vit::testing::read_log(dir_ / "out" / "budget", "eval");
  ASSERT_FALSE(evals.empty());
  EXPECT_LE(evals.back().at("elapsed_s").get<double>(), 10.0);
  EXPECT_GT(evals.back().at("fraction").get<double>(), 0.5);
  std::set<int> sizes;  // 4 then 8 px, following the fraction of the budget
  for (const auto& j : train) sizes.insert(j.at("img_size").get<int>());
  EXPECT_EQ(sizes, (std::set<int>{4, 8}));
}

// --replay under data parallel: each rank replays its own share of each batch, so an update
// trains on the global batch times the replay factor, as on one rank. Batch 96 and 48 are not
// multiples of ET++'s 32 chunks (48 per rank on 2 ranks): unequal chunks made the sample count
// depend on the draws and overflow the batch.
TEST_F(DistCli, ReplayTrainsEachRanksShareSeveralTimes) {
  for (const auto& [ranks, batch] : std::vector<std::pair<int, int>>{{1, 96}, {2, 96}, {1, 48}}) {
    const std::string e = "replay" + std::to_string(ranks) + "_" + std::to_string(batch);
    std::string f = flags(e, "--epochs 1 --replay 2");
    f.replace(f.find("-b 48"), 5, "-b " + std::to_string(batch));
    const RunResult r = run_ranks(ranks, f, dir_.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto train = vit::testing::read_log(dir_ / "out" / e, "train");
    ASSERT_EQ(train.size(), size_t(512 / batch)) << e;
    for (const auto& j : train) {
      EXPECT_EQ(j.at("samples").get<int64_t>(), 2 * batch) << e;
      EXPECT_TRUE(std::isfinite(j.at("loss").get<double>())) << e;
    }
  }
}

// A rank that fails alone (bad data of its own, a full disk) ends the job at once, not after
// --dist-timeout: it exits without MPI_Finalize, which would wait for the other rank, which
// waits in the gradient sum for it.
TEST_F(DistCli, RankThatFailsAloneEndsTheJobAtOnce) {
  setenv("VIT_TEST_FAIL_AT", "1:5", 1);
  const auto t0 = std::chrono::steady_clock::now();
  const RunResult r = run_ranks(2, flags("fail", "--dist-timeout 120"), dir_.string());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  unsetenv("VIT_TEST_FAIL_AT");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("error: rank 1: VIT_TEST_FAIL_AT: rank 1 fails at update 5"),
            std::string::npos)
      << r.err;
  EXPECT_LT(seconds, 60.0) << "the job waited for --dist-timeout";
}

// A 2-rank job of many epochs in the background, and its rank 1 once the first checkpoint is
// written: what a failing rank does to the job.
struct BackgroundJob {
  pid_t mpirun = -1, rank1 = -1;
  fs::path run;
  std::string err;  // the job's stderr file
};

// Ends `job` if it still runs (a failed test must not leave ranks behind).
void end_job(const BackgroundJob& job) {
  if (job.rank1 > 0) kill(job.rank1, SIGKILL);
  if (job.mpirun > 0 && waitpid(job.mpirun, nullptr, WNOHANG) == 0) {
    kill(job.mpirun, SIGKILL);
    waitpid(job.mpirun, nullptr, 0);
  }
}

// The exit status of `pid` within `seconds`, or -1 when it still runs.
int wait_for_exit(pid_t pid, int seconds) {
  int status = 0;
  for (int i = 0; i < seconds * 10; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return -1;
}

class DistJob : public DistCli {
 protected:
  BackgroundJob start(const std::string& exp, const std::string& extra) {
    BackgroundJob job;
    job.run = dir_ / "out" / exp;
    job.err = (dir_ / (exp + "_err.txt")).string();
    const std::string cmd = "exec mpirun -np 2 --oversubscribe -x ASAN_OPTIONS=detect_leaks=0 " +
                            std::string(VIT_BINARY) + " " +
                            flags(exp, "--epochs 500 --log-interval 100 " + extra) +
                            " > /dev/null 2> " + job.err;
    job.mpirun = fork();
    if (job.mpirun == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int i = 0; i < 1200 && !fs::exists(job.run / "state.safetensors"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    job.rank1 = find_rank(1, "--experiment " + exp);
    return job;
  }
};

// A rank killed with SIGKILL mid-run ends the job: mpirun stops the other rank, exits non-zero
// and names the rank; the last checkpoint stays loadable.
TEST_F(DistJob, KilledRankEndsEveryRankAndKeepsTheCheckpoint) {
  const BackgroundJob job = start("killed", "");
  ASSERT_GT(job.mpirun, 0);
  if (job.rank1 <= 0 || kill(job.rank1, SIGKILL) != 0) {
    end_job(job);
    FAIL() << "rank 1 not found";
  }
  const int status = wait_for_exit(job.mpirun, 60);
  end_job(job);
  ASSERT_NE(status, -1) << "the job did not end within 60 s of its rank 1 being killed";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "status " << status;
  const std::string msg = vit::testing::slurp(job.err);
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  EXPECT_EQ(find_rank(0, "--experiment killed"), -1) << "rank 0 still runs";
  EXPECT_NO_THROW(vit::load_train_state((job.run / "state.safetensors").string()));
}

// A rank that hangs (SIGSTOP) leaves the others waiting in a collective: past --dist-timeout
// they end with a message naming the rank and the operation, and mpirun ends the job.
TEST_F(DistJob, HungRankEndsTheJobAfterTheTimeout) {
  const BackgroundJob job = start("hung", "--dist-timeout 3");
  ASSERT_GT(job.mpirun, 0);
  if (job.rank1 <= 0 || kill(job.rank1, SIGSTOP) != 0) {
    end_job(job);
    FAIL() << "rank 1 not found";
  }
  const int status = wait_for_exit(job.mpirun, 60);
  end_job(job);  // also the stopped rank, should mpirun have left it
  ASSERT_NE(status, -1) << "the job still ran 60 s after its rank 1 stopped";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << "status " << status;
  const std::string msg = vit::testing::slurp(job.err);
  EXPECT_NE(msg.find("rank 0: MPI"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did not finish within 3 s (--dist-timeout)"), std::string::npos) << msg;
  EXPECT_NO_THROW(vit::load_train_state((job.run / "state.safetensors").string()));
}

// Ctrl-C (or a scheduler's SIGTERM) that reaches rank 0 alone stops every rank at the same
// update: the state is saved (ZeRO-1 gathers it from both ranks, a collective a rank that went
// on training would not join) and resumes on both ranks.
TEST_F(DistJob, StopRequestOnRankZeroStopsEveryRankWithTheState) {
  const BackgroundJob job = start("sigint", "--shard-optimizer --dist-timeout 30");
  ASSERT_GT(job.mpirun, 0);
  const pid_t rank0 = find_rank(0, "--experiment sigint");
  if (rank0 <= 0 || kill(rank0, SIGINT) != 0) {
    end_job(job);
    FAIL() << "rank 0 not found";
  }
  const int status = wait_for_exit(job.mpirun, 60);
  end_job(job);
  ASSERT_NE(status, -1) << "the job still ran 60 s after the stop request";
  const std::string msg = vit::testing::slurp(job.err);
  EXPECT_EQ(msg.find("did not finish within"), std::string::npos) << msg;
  const vit::TrainState st = vit::load_train_state((job.run / "state.safetensors").string());
  ASSERT_GT(st.step, 0);
  const RunResult r = run_ranks(
      2,
      "train --resume " + job.run.string() + " --stop-after-updates " + std::to_string(st.step + 3),
      dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(vit::load_train_state((job.run / "state.safetensors").string()).step, st.step + 3);
}

// vitrain's warnings on a worker rank (here: unreadable images in an ImageFolder) reach its
// rank<R>.log in the run folder besides stderr. Every other training file is broken, so each
// rank draws some.
TEST_F(DistCli, WorkerRankWarningsReachItsRankLog) {
  const fs::path photos = dir_ / "photos";
  for (const char* split : {"train", "val"})
    for (const char* cls : {"a", "b"})
      for (int i = 0; i < 8; ++i) {
        vit::data::Image img(8, 8, 3);
        for (size_t p = 0; p < img.px.size(); ++p) img.px[p] = uint8_t((p * 7 + size_t(i)) % 251);
        const bool broken = std::string(split) == "train" && i % 2 == 1;
        const std::vector<uint8_t> bytes = broken
                                               ? std::vector<uint8_t>{0xFF, 0xD8, 0xFF, 0xE0, 1, 2}
                                               : vit::data::encode_png(img);
        const fs::path f = photos / split / cls / (std::to_string(i) + (broken ? ".jpg" : ".png"));
        fs::create_directories(f.parent_path());
        std::ofstream(f, std::ios::binary)
            .write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));
      }
  const RunResult r = run_ranks(2,
                                "train --data-dir " + photos.string() +
                                    " --model vit_fmnist_tiny --img-size 8 -b 8 --epochs 1 "
                                    "--warmup-epochs 0 -j 1 --seed 3 --output " +
                                    (dir_ / "out").string() + " --experiment warn",
                                dir_.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string log = vit::testing::slurp(dir_ / "out" / "warn" / "rank1.log");
  EXPECT_NE(log.find("warning: skipping unreadable image"), std::string::npos) << log;
  // Each line of the rank's log is one of the stderr's.
  for (size_t at = 0; (at = log.find("warning: ", at)) != std::string::npos; ++at) {
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(r.err.find(line), std::string::npos) << line;
  }
}

TEST_F(DistCli, BatchTheRanksCannotShareIsOneClearError) {
  const RunResult r = run_ranks(3, flags("bad", "-b 32"), dir_.string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("the batch size 32 must be a multiple of the 3 ranks"), std::string::npos)
      << r.err;
}

}  // namespace
