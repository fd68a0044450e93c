// vitrain's warnings: one line on stderr and, on a data-parallel worker rank, a copy in its log
// in the run folder (rank<R>.log), where the rank's other output and NCCL's warnings go: a
// launcher may show only rank 0's stderr, or none once the job is gone.
#pragma once
#include <cstdio>
#include <string>

namespace vit {

// Writes "warning: <text>" and a newline to stderr, and to the rank log when one is set, each
// in one write (lines from concurrent loader threads do not interleave).
void warn(const std::string& text);

// The open log that warnings are copied to from now on (nullptr: stderr only).
void set_warning_log(std::FILE* log);

}  // namespace vit
