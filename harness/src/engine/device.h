#pragma once
// The device a run trains on: train.device (or --device) is "auto", "cpu",
// "cuda" or "cuda:N". Like the thread count it is recorded with the run but
// is not part of the run's hash: a matrix finished on one device is not
// rerun on another.
#include <string>

namespace chiar::engine {

// Whether this libtorch carries its CUDA library (whatever the machine has).
bool built_with_cuda();

// Whether `name` is one of the forms above ("" when it is, else the
// complaint, for the option table's check).
std::string device_name_problem(const std::string& name);

// What this process can train on, as a device name ("cpu", or "cuda:N").
// Throws UserError, prefixed by `origin` (where the name came from:
// "m.toml:12:10: key 'train.device'", "--device"), for a device this build
// or this machine cannot give:
//   <origin>: "cuda" needs a libtorch built with CUDA; this build has none
//   <origin>: "cuda:2": this machine shows 1 CUDA device (cuda:0)
// and, until the model's kernels have CUDA paths, for any CUDA device:
//   <origin>: "cuda": this version of chiar trains on the CPU only; ...
// "auto" is the CPU for the same reason.
std::string resolve_device(const std::string& name, const std::string& origin);

}  // namespace chiar::engine
