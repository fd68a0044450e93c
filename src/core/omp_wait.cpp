#include "core/omp_wait.h"

#include <sys/auxv.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

namespace vit {

namespace {

constexpr const char* kOpenMpSpinCount = "1000";  // iterations an idle thread spins

// Run by the dynamic loader as a program (`ld.so vitrain ...`; AT_BASE is then 0): an exec of
// /proc/self/exe would start the loader without its arguments. Under valgrind /proc/self/exe
// is valgrind's tool. Both keep the library's default.
bool restart_is_unsafe() {
  if (getauxval(AT_BASE) == 0) return true;
  const char* preload = std::getenv("LD_PRELOAD");
  return preload && std::strstr(preload, "vgpreload");
}

}  // namespace

void limit_openmp_spinning(char** argv) {
  if (argv && argv[0]) {  // the kernel names an exec of /proc/self/exe "exe": keep ours
    const char* slash = std::strrchr(argv[0], '/');
    prctl(PR_SET_NAME, slash ? slash + 1 : argv[0], 0, 0, 0);
  }
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;
  if (restart_is_unsafe()) return;
  if (setenv("GOMP_SPINCOUNT", kOpenMpSpinCount, 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure
}

std::string openmp_spin_setting() {
  std::ifstream f("/proc/self/environ", std::ios::binary);
  const std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string key = "GOMP_SPINCOUNT=";
  for (size_t at = 0; at < env.size();) {
    const size_t end = std::min(env.find('\0', at), env.size());
    if (env.compare(at, key.size(), key) == 0)
      return env.substr(at + key.size(), end - at - key.size());
    at = end + 1;
  }
  return "";
}

}  // namespace vit
