// Launcher environments (dist/launch_env.h) and the TCP meeting point of torchrun / srun jobs
// (dist/tcp_exchange.h). The exchange runs its ranks as threads of this process on localhost.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cli_harness.h"
#include "core/common.h"
#include "dist/launch_env.h"
#include "dist/tcp_exchange.h"

namespace {

using Vars = std::map<std::string, std::string>;

std::string error_of(const Vars& v) {
  try {
    vit::read_launch_env(&v);
  } catch (const vit::Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, NoLauncherIsAWorldOfOne) {
  const Vars v;
  const vit::LaunchEnv e = vit::read_launch_env(&v);
  EXPECT_EQ(e.launcher, vit::Launcher::None);
  EXPECT_EQ(e.size, 1);
  EXPECT_EQ(e.rank, 0);
}

TEST(LaunchEnv, Torchrun) {
  const Vars v = {{"RANK", "5"},
                  {"WORLD_SIZE", "16"},
                  {"LOCAL_RANK", "5"},
                  {"MASTER_ADDR", "node0"},
                  {"MASTER_PORT", "29500"}};
  const vit::LaunchEnv e = vit::read_launch_env(&v);
  EXPECT_EQ(e.launcher, vit::Launcher::Torchrun);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.size, 16);
  EXPECT_EQ(e.local_rank, 5);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29500);
  EXPECT_EQ(e.exchange_port, 29501) << "never MASTER_PORT: torchrun's agent store holds it";
  EXPECT_EQ(e.local_size, 0) << "LOCAL_WORLD_SIZE not given";
}

TEST(LaunchEnv, ExchangePortAndLocalSize) {
  Vars v = {{"RANK", "1"},
            {"WORLD_SIZE", "3"},
            {"LOCAL_RANK", "1"},
            {"LOCAL_WORLD_SIZE", "3"},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", "65535"}};
  vit::LaunchEnv e = vit::read_launch_env(&v);
  EXPECT_EQ(e.exchange_port, 65534);
  EXPECT_EQ(e.local_size, 3);
  v["VIT_EXCHANGE_PORT"] = "4000";
  EXPECT_EQ(vit::read_launch_env(&v).exchange_port, 4000);
  v["VIT_EXCHANGE_PORT"] = "65535";
  EXPECT_NE(error_of(v).find("VIT_EXCHANGE_PORT=65535 is not a port (1-65535) other than "
                             "MASTER_PORT"),
            std::string::npos)
      << error_of(v);
  const Vars slurm = {{"SLURM_PROCID", "0"},
                      {"SLURM_NTASKS", "4"},
                      {"SLURM_NTASKS_PER_NODE", "2"},
                      {"MASTER_ADDR", "h"},
                      {"MASTER_PORT", "100"}};
  EXPECT_EQ(vit::read_launch_env(&slurm).local_size, 2);
  Vars uneven = slurm;
  uneven["SLURM_NTASKS_PER_NODE"] = "2(x2)";
  EXPECT_EQ(vit::read_launch_env(&uneven).local_size, 0) << "not a plain count: unknown";
}

TEST(LaunchEnv, SlurmAndMpiPrecedence) {
  Vars v = {{"SLURM_PROCID", "9"},
            {"SLURM_NTASKS", "16"},
            {"SLURM_LOCALID", "1"},
            {"MASTER_ADDR", "10.0.0.1"},
            {"MASTER_PORT", "1234"}};
  vit::LaunchEnv e = vit::read_launch_env(&v);
  EXPECT_EQ(e.launcher, vit::Launcher::Slurm);
  EXPECT_EQ(e.rank, 9);
  EXPECT_EQ(e.local_rank, 1);
  // mpirun inside a Slurm allocation: OpenMPI's variables win, and MPI needs no MASTER_*.
  v = {{"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "1"},
       {"OMPI_COMM_WORLD_SIZE", "4"},
       {"OMPI_COMM_WORLD_RANK", "2"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}};
  e = vit::read_launch_env(&v);
  EXPECT_EQ(e.launcher, vit::Launcher::Mpi);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.size, 4);
}

TEST(LaunchEnv, BadVariablesGetOneClearLine) {
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
                .find("RANK is not set"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"WORLD_SIZE", "2"}, {"RANK", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})
          .find("RANK=2 is not below WORLD_SIZE=2"),
      std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}, {"RANK", "1"}, {"MASTER_PORT", "1"}})
                .find("MASTER_ADDR is not set"),
            std::string::npos);
  EXPECT_NE(error_of({{"WORLD_SIZE", "2"}, {"RANK", "x1"}}).find("RANK='x1' is not a non-negative"),
            std::string::npos);
  EXPECT_NE(
      error_of({{"WORLD_SIZE", "2"}, {"RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}})
          .find("MASTER_PORT=70000 is not a port"),
      std::string::npos);
  // A world of one needs no meeting point.
  EXPECT_EQ(error_of({{"WORLD_SIZE", "1"}, {"RANK", "0"}}), "");
}

// Two local ranks and one GPU: an error naming both counts, unless NCCL 2.30's multi-rank
// switch asks for it; a rank never silently lands on another rank's GPU.
TEST(ChooseGpu, MoreLocalRanksThanGpusNeedsTheMultiRankSwitch) {
  Vars v = {{"RANK", "1"},
            {"WORLD_SIZE", "2"},
            {"LOCAL_RANK", "1"},
            {"LOCAL_WORLD_SIZE", "2"},
            {"MASTER_ADDR", "127.0.0.1"},
            {"MASTER_PORT", "29500"}};
  const vit::LaunchEnv e = vit::read_launch_env(&v);
  EXPECT_EQ(vit::choose_gpu(e, 2, &v), 1);
  EXPECT_EQ(vit::choose_gpu(e, 8, &v), 1);
  std::string err;
  try {
    vit::choose_gpu(e, 1, &v);
  } catch (const vit::Error& x) {
    err = x.what();
  }
  EXPECT_NE(err.find("rank 1: 2 ranks on this host and 1 GPU: launch one rank per GPU, or set "
                     "NCCL_MULTI_RANK_GPU_ENABLE=1"),
            std::string::npos)
      << err;
  v["NCCL_MULTI_RANK_GPU_ENABLE"] = "1";
  EXPECT_EQ(vit::choose_gpu(e, 1, &v), 0);
  // Rank 0 of the same job sees the same error without LOCAL_WORLD_SIZE's help only when its
  // own local rank is past the GPUs; with it, every local rank does.
  Vars r0 = {{"RANK", "0"},
             {"WORLD_SIZE", "2"},
             {"LOCAL_RANK", "0"},
             {"LOCAL_WORLD_SIZE", "2"},
             {"MASTER_ADDR", "127.0.0.1"},
             {"MASTER_PORT", "29500"}};
  EXPECT_THROW(vit::choose_gpu(vit::read_launch_env(&r0), 1, &r0), vit::Error);
}

// A free TCP port on localhost (bound once and released; the tests use it right away).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

vit::LaunchEnv rank_env(int rank, int size, int port) {
  vit::LaunchEnv e;
  e.launcher = vit::Launcher::Torchrun;
  e.rank = rank;
  e.size = size;
  e.master_addr = "127.0.0.1";
  e.master_port = port == 1 ? 2 : port - 1;
  e.exchange_port = port;
  return e;
}

struct Outcome {
  std::string blob, error;
};

// Runs the given ranks of a `size`-rank job as threads; rank 0 (when listed) shares `blob`.
std::vector<Outcome> run_ranks(const std::vector<int>& ranks, int size, int port,
                               const std::string& blob, double timeout_s) {
  std::vector<Outcome> out(ranks.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        out[i].blob = vit::tcp_share_from_rank0(rank_env(ranks[i], size, port),
                                                ranks[i] == 0 ? blob : "", timeout_s);
      } catch (const std::exception& e) {
        out[i].error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return out;
}

TEST(TcpExchange, EveryRankGetsRankZerosBlob) {
  std::string id(128, '\0');  // NCCL's unique id is 128 bytes, zeros and all
  for (size_t i = 0; i < id.size(); ++i) id[i] = char(i * 7);
  // Rank 0 last: the others must retry until it listens.
  const std::vector<Outcome> out = run_ranks({3, 1, 2, 0}, 4, free_port(), id, 20.0);
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].error, "") << "thread " << i;
    EXPECT_EQ(out[i].blob, id) << "thread " << i;
  }
}

TEST(TcpExchange, MissingRankIsNamedByRankZero) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<Outcome> out = run_ranks({0, 1}, 3, free_port(), "id", 1.0);  // no rank 2
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(out[0].error.find("rank 0: ranks 2 did not connect"), std::string::npos)
      << out[0].error;
  EXPECT_NE(out[1].error.find("rank 1: rank 0 at 127.0.0.1:"), std::string::npos) << out[1].error;
  EXPECT_LT(waited, 10.0) << "the timeout ends the wait";
}

TEST(TcpExchange, UnreachableRankZeroIsAClearError) {
  const std::vector<Outcome> out = run_ranks({1}, 2, free_port(), "", 0.5);
  EXPECT_NE(out[0].error.find("rank 1: rank 0 did not accept a connection at 127.0.0.1:"),
            std::string::npos)
      << out[0].error;
}

TEST(TcpExchange, StrayConnectionsAreIgnored) {
  const int port = free_port();
  std::vector<Outcome> r0, r1;
  std::thread rank0([&] { r0 = run_ranks({0}, 2, port, "abc", 20.0); });
  // A stranger connects while rank 0 waits (retrying until it listens), sends junk, leaves.
  bool stray_connected = false;
  for (int attempt = 0; attempt < 200 && !stray_connected; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(uint16_t(port));
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const char junk[16] = "GET / HTTP/1.0\n";
      (void)::send(fd, junk, sizeof junk, MSG_NOSIGNAL);
      stray_connected = true;
    }
    ::close(fd);
    if (!stray_connected) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(stray_connected);
  r1 = run_ranks({1}, 2, port, "", 20.0);  // then the real rank 1
  rank0.join();
  EXPECT_EQ(r0[0].error, "");
  EXPECT_EQ(r1[0].error, "");
  EXPECT_EQ(r1[0].blob, "abc");
}

// A free port whose successor is free too (MASTER_PORT and the exchange's MASTER_PORT + 1).
int free_port_pair() {
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int p = free_port();
    if (p >= 65535) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(uint16_t(p + 1));
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    if (ok) return p;
  }
  return free_port();
}

// torchrun's elastic agent listens on MASTER_PORT (its TCP store, TORCHELASTIC_USE_AGENT_STORE)
// on rank 0's host for the whole job: the ranks' exchange must go elsewhere, and never touch it.
TEST(TcpExchange, WorksWhileTorchrunsAgentHoldsMasterPort) {
  const int master_port = free_port_pair();
  const int agent = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(uint16_t(master_port));
  ASSERT_EQ(::bind(agent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(agent, 16), 0);
  const int size = 3;
  std::vector<std::string> blob(size), error(size);
  std::vector<std::thread> ranks;
  for (int r = 0; r < size; ++r)
    ranks.emplace_back([&, r] {
      const Vars v = {{"RANK", std::to_string(r)},
                      {"WORLD_SIZE", std::to_string(size)},
                      {"LOCAL_RANK", std::to_string(r)},
                      {"MASTER_ADDR", "127.0.0.1"},
                      {"MASTER_PORT", std::to_string(master_port)},
                      {"TORCHELASTIC_USE_AGENT_STORE", "True"}};
      try {
        blob[size_t(r)] =
            vit::tcp_share_from_rank0(vit::read_launch_env(&v), r == 0 ? "the-id" : "", 20.0);
      } catch (const std::exception& e) {
        error[size_t(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(error[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(blob[size_t(r)], "the-id") << "rank " << r;
  }
  pollfd p{agent, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "no rank connected to the agent's store";
  ::close(agent);
}

// On the CPU a torchrun job of several ranks stops at once with one line that says how to
// launch instead (never trains N copies of the same run); torchrun and srun are for GPU jobs.
TEST(LaunchCli, TorchrunCpuJobIsRefusedWithOneLine) {
  vit::testing::TempDir dir;
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "0", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(free_port()).c_str(), 1);
  const vit::testing::RunResult r =
      vit::testing::run_vitrain("train --epochs 1 --output " + dir.str(), dir.str());
  for (const char* v : {"WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(v);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(
                "launched by torchrun with 2 ranks on the CPU: data parallel on the CPU runs under "
                "mpirun"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

}  // namespace
