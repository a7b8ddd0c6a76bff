#pragma once
// The tiny matrix the engine, store, durability and fault tests run: a word
// corpus and m.toml of 2-layer, 16-wide models trained a few steps on one
// thread. The parts are named so that a file whose matrix differs shares
// only what is really the same. Runs' hashes and metrics are pinned by
// tests: a changed value here changes them.
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "temp_dir.h"

namespace chiar::test {

// [model]: 16 wide, 2 heads.
extern const std::string kTinyModelTable;
// [variants.base]: two attention layers.
extern const std::string kTinyBaseVariant;
// [variants.routed]: dct, then dct|attn chosen by a threshold router.
extern const std::string kTinyRoutedVariant;
// [tasks.lm]: the word corpus under corpus/, 8 tokens a sequence.
extern const std::string kTinyLmTask;
// [tasks.flat]: a small generated ListOps-flat split.
extern const std::string kTinyFlatTask;

// The body of a [train] table (no header): batches of 4, 2 warm-up steps,
// evaluation batches of 8, one calibration batch, one thread.
std::string tiny_train_body(int64_t steps, int64_t eval_every, int64_t checkpoint_every);
// tiny_train_body(6, 3, 3): six steps, validated and checkpointed every three.
std::string tiny_train_body();

// The word corpus the engine tests train on (corpus/ under d).
void write_tiny_corpus(const TempDir& d);

// The word corpus the engine tests train on, and m.toml: `matrix_body` (the
// [matrix] body), the shared [model], `train_body` (the [train] body), the
// variants base and routed, the tasks lm and flat, then `extra` (more tables).
void write_tiny_matrix(const TempDir& d, const std::string& matrix_body, const std::string& train_body,
                       const std::string& extra = "");

// write_tiny_matrix of the engine and matrix tests: matrix "e2e", 2 variants
// x 2 tasks x 2 seeds of six-step runs; `train_extra` goes into [train],
// `extra` (more tables) at the end.
void write_e2e_matrix(const TempDir& d, const std::string& train_extra = "", const std::string& extra = "");

// write_tiny_matrix with one run: the attention baseline on flat ListOps,
// seed 0, in a matrix called `name`.
void write_one_run_matrix(const TempDir& d, const std::string& name, const std::string& train_body);

// `chiar run <d>/m.toml --db DB` with the data and cache folders under d.
std::vector<std::string> tiny_run_args(const TempDir& d, const std::string& db);

// The first column of the first row of a query on a store, read-only; -1
// when there is no row.
int64_t query_integer(const std::string& db, const std::string& sql);

// The test split's metrics (best and last checkpoint) of the runs whose name
// matches `run_glob`, in a fixed order: what resume tests compare bit for bit.
std::vector<double> test_split_metrics(const std::string& db, const std::string& run_glob = "*");

// One logged training step.
struct TrainLogRow {
  std::string run;  // the run's name
  int64_t step = 0;
  double loss = 0, lr = 0;
  bool operator==(const TrainLogRow& o) const { return run == o.run && step == o.step && loss == o.loss && lr == o.lr; }
};
std::ostream& operator<<(std::ostream& out, const TrainLogRow& row);
// Every logged step of every run in a store, by run name and step.
std::vector<TrainLogRow> train_logs(const std::string& db);

}  // namespace chiar::test
