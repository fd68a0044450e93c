// Shared pieces of the end-to-end CLI tests: running the vitrain binary, a per-test scratch
// directory, and a small learnable IDX data set.
#pragma once
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "temp_dir.h"

namespace vit::testing {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string out, err;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs the vitrain binary with a shell command line; captures stdout and stderr in `dir`.
// `env`, when given, are env(1) arguments that change the binary's environment ("-u NAME", "A=1").
inline RunResult run_vitrain(const std::string& args, const std::string& dir,
                             const std::string& env = "") {
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(VIT_BINARY) + " " +
                          args + " > " + out + " 2> " + err + " < /dev/null";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// tests/reference/timm_logits_check.py (fp32 tolerances, on the CPU) on an export and the
// logits vitrain eval saved; `extra` adds flags. exit_code is -1 if it did not exit; out holds
// what it printed.
inline RunResult run_logits_check(const std::string& export_dir, const std::string& logits,
                                  const std::string& data, const std::string& dir,
                                  const std::string& extra = "") {
  const std::string out = dir + "/check.txt";
  const std::string cmd = std::string(VIT_PYTHON) +
                          " " VIT_SOURCE_DIR "/tests/reference/timm_logits_check.py --export " +
                          export_dir + " --logits " + logits + " --data-dir " + data +
                          " --precision fp32 --device cpu " + extra + " > " + out + " 2>&1";
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  return r;
}

inline void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  gzclose(f);
}

inline std::vector<uint8_t> idx_header(uint8_t ndims, std::vector<uint32_t> dims) {
  std::vector<uint8_t> h = {0, 0, 0x08, ndims};
  for (uint32_t d : dims)
    for (int s = 24; s >= 0; s -= 8) h.push_back(uint8_t(d >> s));
  return h;
}

// A learnable 4-class toy data set of 8x8 images: class k has k + 1 bright 4x4 quadrants.
inline void write_toy_idx(const std::string& dir, int n_train, int n_test) {
  fs::create_directories(dir);
  Rng rng(3);
  for (auto [prefix, n] : {std::pair{"train", n_train}, std::pair{"t10k", n_test}}) {
    std::vector<uint8_t> img = idx_header(3, {uint32_t(n), 8, 8});
    std::vector<uint8_t> lab = idx_header(1, {uint32_t(n)});
    for (int i = 0; i < n; ++i) {
      const int k = int(rng.below(4));
      lab.push_back(uint8_t(k));
      int bright[4] = {0, 1, 2, 3};  // the first k + 1 of a random order are bright
      for (int j = 3; j > 0; --j) std::swap(bright[j], bright[rng.below(uint64_t(j + 1))]);
      for (int y = 0; y < 8; ++y)
        for (int x = 0; x < 8; ++x) {
          const int q = (y / 4) * 2 + (x / 4);
          bool bar = false;
          for (int j = 0; j <= k; ++j) bar = bar || bright[j] == q;
          img.push_back(uint8_t(bar ? 200 + rng.below(50) : rng.below(40)));
        }
    }
    write_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", img);
    write_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", lab);
  }
}

// The objects of one type ("train", "eval", "size", ...) of a run's log.jsonl, in order.
inline std::vector<nlohmann::json> read_log(const fs::path& run_dir, const std::string& type) {
  std::vector<nlohmann::json> v;
  std::ifstream f(run_dir / "log.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.value("type", "") == type) v.push_back(j);
  }
  return v;
}

// Per-update training losses of a run (its log.jsonl's "train" objects), keyed by optimizer step.
inline std::map<int64_t, double> train_losses(const fs::path& run_dir) {
  std::map<int64_t, double> m;
  for (const auto& j : read_log(run_dir, "train"))
    m[j.at("step").get<int64_t>()] = j.at("loss").get<double>();
  return m;
}

// A fixture with a fresh scratch directory per test (removed afterwards) holding the toy data
// set in data_ (512 train / 128 eval images).
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override { write_toy_idx(data_, 512, 128); }

  TempDir tmp_;
  fs::path dir_ = tmp_.path;
  std::string data_ = (dir_ / "data").string();
};

}  // namespace vit::testing
