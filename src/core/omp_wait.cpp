#include "core/omp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace vit {

void limit_openmp_spinning(char** argv) {
  if (std::getenv("GOMP_SPINCOUNT") || std::getenv("OMP_WAIT_POLICY")) return;
  if (setenv("GOMP_SPINCOUNT", kOpenMpSpinCount, 1) != 0) return;
  execv("/proc/self/exe", argv);  // returns only on failure
}

}  // namespace vit
