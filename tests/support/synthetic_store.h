#pragma once
// Synthetic stores for measuring how the store's commands (show, export,
// report, merge) grow with the number of runs. A store holds what `chiar run`
// writes for a real matrix: per run its provenance, a training log, validation
// metrics at every evaluation, test metrics of the best and last checkpoints,
// FLOP records per layer and operator, and for routed variants the routing
// shares, entropy histograms and thresholds. Values are drawn from a seeded
// generator, so the same shape always gives the same store.
//
// The runs are an ablation sweep as a cluster user runs one: four tasks (two
// classification, two language modelling, each with the family a claim in
// configs/claims.toml names), five seeds, and as many variants as the size
// needs: the five of configs/variants.toml the claims compare, then threshold
// sweep points (chiar_threshold3_s1, ...). About 1% of runs failed and 0.5%
// diverged, as in a real sweep.
#include <cstdint>
#include <string>

namespace chiar::test {

struct SyntheticStoreShape {
  int64_t runs = 100;
  // The index of the first run: stores with consecutive ranges hold disjoint
  // runs of one sweep, like the shard stores of `chiar slurm`.
  int64_t first_run = 0;
  int64_t seeds = 5;
  int64_t steps = 1000;
  int64_t log_every = 10;    // a training-log row every log_every steps
  int64_t eval_every = 100;  // validation metrics, FLOPs and routing every eval_every steps
  int64_t layers = 4;        // the middle layers of routed variants are routed
  int64_t histogram_bins = 20;
  uint64_t seed = 0;
};

// Writes the shape's runs into a new store at `file` (which must not exist),
// in one transaction.
void write_synthetic_store(const std::string& file, const SyntheticStoreShape& shape);

// The number of runs of a shape that finished as `done` (the rest failed or
// diverged): what `chiar export --csv` lists with a test metric.
int64_t synthetic_done_runs(const SyntheticStoreShape& shape);

}  // namespace chiar::test
