// The atomic writer's leftovers: a writer killed mid-write leaves "<name>.tmp.<pid>"; a resume
// removes those of dead processes and nothing else.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "temp_dir.h"

namespace {

namespace fs = std::filesystem;

pid_t dead_pid() {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  waitpid(child, nullptr, 0);
  return child;  // reaped: no such process now
}

TEST(AtomicFile, StaleTempFilesOfDeadWritersAreRemoved) {
  vit::testing::TempDir tmp;
  const fs::path dir = tmp.path;
  const std::string dead = std::to_string(dead_pid()), alive = std::to_string(getpid());
  const std::vector<std::string> kept = {"log.jsonl.tmp." + alive, "notes.tmp.abc",
                                         "last.safetensors", "tmp.", "weights.tmp." + dead + "x"};
  for (const std::string& name : kept) std::ofstream(dir / name) << "x";
  std::ofstream(dir / ("state.safetensors.tmp." + dead)) << "x";
  EXPECT_EQ(vit::io::remove_stale_temp_files(dir.string()), 1);
  EXPECT_FALSE(fs::exists(dir / ("state.safetensors.tmp." + dead)));
  for (const std::string& name : kept) EXPECT_TRUE(fs::exists(dir / name)) << name;
  EXPECT_EQ(vit::io::remove_stale_temp_files((dir / "missing").string()), 0);
}

}  // namespace
