// Signals that would otherwise end a run without a word: a memory-mapped data file truncated
// while training (SIGBUS) gets one clear error line and exit status 1; a write past the file-size
// limit (ulimit -f) fails with EFBIG, reported like any write error, instead of SIGXFSZ killing
// the process. Checkpoints are written atomically, so the last one stays loadable either way.
#pragma once
#include <string>

namespace vit {

// Installs the handlers (vitrain's main calls it once).
void install_fatal_signal_handlers();

// Records a file mapped into memory, named in the SIGBUS message (the last few are kept).
void note_mapped_file(const std::string& path);

}  // namespace vit
