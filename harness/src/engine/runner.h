#pragma once
#include <string>
#include <vector>

#include "chiar/registry.h"
#include "matrix.h"

namespace chiar::engine {

struct RunnerOptions {
  std::string db;         // the store; default results/<matrix>.db
  std::string data_root;  // relative data paths start here
  std::string cache_dir;  // tokenisers, archives
  bool dry_run = false;   // print the runs and what would be skipped; run nothing
  int threads = 0;        // overrides train.threads when > 0
  std::string gemm = "auto";  // the library behind the model's products (configure_gemm)
  // No other process writes the store (each Slurm array task has its own):
  // a run left 'running' is resumed at once, not after its heartbeat ages.
  bool sole_writer = false;
  std::string device;  // overrides train.device when not empty (engine/device.h)
};

// Runs every run of the matrix that is not finished. Returns the exit status:
// 0 when every run ended (done, failed or diverged), 130 when interrupted.
// Configuration and plugin errors are thrown before the store is touched.
int run_matrix(const Matrix& matrix, const PluginRegistry& registry, const RunnerOptions& options);

// The store's results, one row per run: for `chiar show` and `chiar export`.
struct ResultRow {
  std::vector<std::string> cells;
};
std::vector<std::string> result_columns();
std::vector<ResultRow> read_results(const std::string& db);

}  // namespace chiar::engine
