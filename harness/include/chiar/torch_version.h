#pragma once
// The libtorch release this build compiles against, for code that differs
// between 1.13 (Debian 12) and the newer releases users bring via Torch_DIR.
#include <torch/version.h>

#define CHIAR_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
