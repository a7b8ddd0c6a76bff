#pragma once
// A run's checkpoint folder before its first checkpoint: made, the resolved
// spec written beside the checkpoints, its free space checked.
#include <cstdint>
#include <string>

#include "engine/config/run_spec.h"

namespace chiar::engine {

// Creates `dir` (EnvironmentError naming it when it cannot) and writes the
// resolved spec there as spec.toml: a checkpoint folder alone suffices to
// rebuild the model (chiar inspect).
void prepare_checkpoint_dir(const RunSpec& spec, const std::string& dir);

// Warns on stderr when the folder's file system lacks room for the next
// state checkpoint (float32 weights and AdamW's two moments) and best model
// (weights), written while the previous ones still exist.
void warn_if_short_of_space(const std::string& dir, int64_t params);

}  // namespace chiar::engine
