// Crash-safe file writing: bytes go to "<path>.tmp.<pid>", are fsync'ed, then renamed over
// <path> and the directory is fsync'ed, so a kill at any moment leaves either the old or the new
// complete file. Throws vit::Error on failure (the temp file is removed).
#pragma once
#include <string>
#include <string_view>

namespace vit::io {

void write_file_atomic(const std::string& path, std::string_view bytes);
std::string read_file(const std::string& path);  // throws vit::Error if unreadable

// Removes the temp files ("<name>.tmp.<pid>") that writers killed mid-write left in `dir`:
// those whose process no longer exists. Returns how many were removed.
int remove_stale_temp_files(const std::string& dir);

}  // namespace vit::io
