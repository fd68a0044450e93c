#include "cli/launch_check.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>

#include "core/common.h"
#include "dist/bootstrap.h"
#include "dist/comm.h"
#include "dist/launch_env.h"

namespace vit {

namespace {

constexpr const char* kHelp =
    "usage: vitrain launch-check [--timeout SECONDS]\n"
    "Run under the launcher of a data-parallel job (mpirun, torchrun --no_python, srun): each\n"
    "rank prints one line with its rank, the world size, its local rank, the launcher, how it\n"
    "met rank 0 and the hash of the id rank 0 sent. Needs no GPU and no data.\n"
    "  --timeout S   give up after S seconds (default 60)\n";

std::string random_id() {
  std::random_device rd;
  std::string id(128, '\0');  // NCCL's unique id is 128 bytes
  for (char& c : id) c = char(rd() & 0xff);
  return id;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

int run_launch_check(int argc, char** argv) {
  double timeout_s = 60;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      fmt::print("{}", kHelp);
      return 0;
    }
    VIT_CHECK(a == "--timeout" && i + 1 < argc,
              fmt::format("launch-check: unknown option '{}' (see --help)", a));
    char* end = nullptr;
    timeout_s = std::strtod(argv[++i], &end);
    VIT_CHECK(
        end != argv[i] && *end == '\0' && timeout_s > 0 && timeout_s < 1e6,
        fmt::format("launch-check: --timeout {} is not a positive number of seconds", argv[i]));
  }
  const LaunchEnv env = read_launch_env();
  // Under mpirun the id goes through MPI, as for the NCCL world.
  std::shared_ptr<Comm> mpi = env.launcher == Launcher::Mpi && env.size > 1 ? make_comm() : nullptr;
  const std::string id =
      share_from_rank0(env, mpi.get(), env.rank == 0 ? random_id() : "", timeout_s);
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string line = fmt::format(
      "launch-check rank={} size={} local_rank={} local_size={} launcher={} master_port={} "
      "via={} host={} id={:016x} id_bytes={}\n",
      env.rank, env.size, env.local_rank, env.local_size, launcher_name(env.launcher),
      env.master_port, bootstrap_route(env, mpi.get()), host, fnv1a(id), id.size());
  std::fwrite(line.data(), 1, line.size(), stdout);  // one write: lines of ranks do not mix
  std::fflush(stdout);
  return 0;
}

}  // namespace vit
