#pragma once
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "chiar/registry.h"
#include "engine/config/matrix.h"

namespace chiar::engine {

struct RunnerOptions {
  std::string db;             // the store; default results/<matrix>.db
  std::string data_root;      // relative data paths start here
  std::string cache_dir;      // tokenisers, archives
  bool dry_run = false;       // print the runs and what would be skipped; run nothing
  int threads = 0;            // overrides train.threads when > 0
  std::string gemm = "auto";  // the library behind the model's products (configure_gemm)
  // No other process writes the store (each Slurm array task has its own):
  // a run left 'running' is resumed at once, not after its heartbeat ages.
  bool sole_writer = false;
  std::string device;  // overrides train.device when not empty (engine/runtime/device.h)
  // Runs recorded failed start again as new (Store::restart_failed), instead
  // of being skipped as finished.
  bool retry_failed = false;
};

// Runs every run of the matrix that is not finished. Returns the exit status:
// 0 when every run ended (done, failed or diverged), 130 when interrupted.
// Configuration and plugin errors are thrown before the store is touched.
int run_matrix(const Matrix& matrix, const PluginRegistry& registry, const RunnerOptions& options);

// Starts the failed runs of `matrix` recorded in the store `db` again, as new
// (Store::restart_failed), and names them on `report`; returns how many. What
// --retry-failed does before a matrix runs, and what `chiar slurm
// --retry-failed` does to each shard store once, before its job starts.
size_t retry_failed_runs(const Matrix& matrix, const std::string& db, std::ostream& report);

}  // namespace chiar::engine
