// Shared basics: index type, the error type every layer throws, and check helpers.
// Dimension letters used across the code base:
//   B batch, N tokens (incl. class token), C channels (embed dim), H heads, D head dim,
//   P patch size, L layers, K classes, M hidden width of the FFN.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

namespace vit {

using Index = int64_t;

// Every user-facing failure (bad file, bad flag, bad checkpoint) is a vit::Error; the CLI
// prints its message as one line and exits non-zero.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define VIT_CHECK(cond, msg)                           \
  do {                                                 \
    if (!(cond)) throw ::vit::Error(std::string(msg)); \
  } while (0)

}  // namespace vit
