// How long idle OpenMP threads spin before they sleep, set for the whole process.
#pragma once
#include <string>

namespace vit {

// GNU OpenMP spins an idle thread for up to 300,000 iterations before it sleeps. Where another
// process (or our own loader threads) wants the same cores, those spins take the cores away
// from the threads that have work, and every one of the hundreds of parallel regions in a step
// waits out a descheduled thread: two small CPU trainings side by side on two cores took 12-80x
// longer than one alone. Spinning 1,000 iterations costs a run alone nothing measurable and
// keeps two side by side within 2x of one alone (docs/benchmarks.md).
//
// libgomp reads GOMP_SPINCOUNT once, when it loads, before main: so when neither
// GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set, this sets GOMP_SPINCOUNT=1000 and executes the
// program again with the same arguments (same process id and name). It returns when nothing had
// to change, when a restart cannot work (run by the dynamic loader as a program, under
// valgrind: set GOMP_SPINCOUNT there yourself) or when the exec failed; the run then goes on
// with the library's default.
void limit_openmp_spinning(char** argv);

// The GOMP_SPINCOUNT this process started with, which libgomp read ("" when unset): from
// /proc/self/environ, which a setenv after the start does not change.
std::string openmp_spin_setting();

}  // namespace vit
