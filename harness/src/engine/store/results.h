#pragma once
// Everything the commands read back from a store: `chiar show` and `export`
// (the results table), `report` and `plan` (runs, metrics, FLOPs, routing,
// curves, provenance), `inspect` (a run's spec and checkpoints). The read
// queries live here and nowhere else; the store's writes are Store's
// (store.h) and the copies between stores merge's (merge.h).
//
// Attention FLOPs are counted by operator trait, never by name: each FLOP
// row records whether its operator counts as attention (schema 9); a row
// recorded before that has no flag, and the reader asks the loaded plugins'
// traits instead (OperatorFlops::attention).
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/store/run_status.h"
#include "engine/store/store.h"

namespace chiar::engine {

// A run as the runs table holds it: the columns reports read.
struct StoredRun {
  int64_t id = 0;
  std::string name, variant, task, error;
  std::string family;  // the task table's "family", "" when it set none
  RunStatus status = RunStatus::Pending;
  int64_t seed = 0, diverged_step = -1, params = 0;
  double train_tps = 0, eval_tps = 0;
  double step_ms = 0;                                  // median training step
  double gpu_allocated_mb = -1, gpu_reserved_mb = -1;  // peaks on a GPU; -1 for a run on the CPU
  std::string tau;                                     // thresholds in force, JSON
  // The code that made the run: the commit its binary was built from, whether
  // tracked files differed from it then, and the library that ran its
  // products ("onednn", "blas"; "" when not recorded).
  std::string commit, gemm;
  bool dirty = false;
  // The hardware its speeds were taken on, as the run recorded it: device,
  // CPU, threads, processes and the product kernels ("cpu, AMD EPYC, 2
  // threads, 1 process, onednn: oneDNN 2.6.3 sgemm, ISA avx2"). Two runs'
  // speeds compare only when these match; "" when none was recorded.
  std::string timing_setup;
};

// One operator's FLOPs per sequence at a run's last FLOP record, summed
// over layers.
struct OperatorFlops {
  std::string op;
  // Whether the operator's traits counted it as attention when the run
  // recorded it; nullopt for rows from before schema 9.
  std::optional<bool> attention;
  double fwd_executed = 0, fwd_sparse = 0, train_executed = 0;
  // The recorded flag, or for an older row `trait` (the loaded plugin's).
  bool counts_as_attention(bool trait) const { return attention.value_or(trait); }
};

// One operator's share of a routed layer's tokens at each recorded step.
struct RoutingSeries {
  int64_t layer = 0;
  std::string op;
  std::vector<std::pair<int64_t, double>> shares;  // (step, share in [0, 1])
};

// The spectral-entropy histogram of one routed layer at a run's last record.
struct LayerHistogram {
  struct Bin {
    double lo = 0, hi = 0;
    int64_t count = 0;
  };
  int64_t layer = 0;
  std::vector<Bin> bins;
};

// Where a store's runs came from, each field one line of the report's footer.
struct StoreProvenance {
  std::string commits, torch, blas, gemm, threads, hosts, cpus, devices, allocators, first, last, matrices;
  // The machine time the finished runs took, summed run by run: their
  // training loops with the validations inside them. A store filled over
  // several sittings spans more wall time than it cost (first..last), so a
  // budget is read from this sum.
  int64_t finished_runs = 0;
  double training_hours = 0;
};

// A run found by id, name or hash, for `chiar inspect`.
struct RunLookup {
  std::string hash, status, spec_toml;  // spec_toml "" when not stored
};

// Metric values of one run by step and name.
using MetricsByStep = std::map<int64_t, std::map<std::string, double>>;

// A store opened read-only (refusing what Store refuses) and the queries on
// it. Each query is prepared once per reader and returns whole values, so a
// report over 10,000 runs prepares a handful of statements, not 50,000.
class ResultsReader {
 public:
  explicit ResultsReader(const std::string& file);
  ~ResultsReader();
  ResultsReader(const ResultsReader&) = delete;
  ResultsReader& operator=(const ResultsReader&) = delete;
  const std::string& file() const;

  std::vector<StoredRun> runs();        // every run, by id
  std::vector<std::string> variants();  // the distinct variants, sorted
  int64_t run_count();
  // Test metrics of the best-validation and the last checkpoint.
  void test_metrics(int64_t run, std::map<std::string, double>& best, std::map<std::string, double>& last);
  // Validation metrics of the model as it trained (checkpoint 'current'),
  // the names asked for only.
  MetricsByStep validation_metrics(int64_t run, const std::vector<std::string>& names);
  std::vector<OperatorFlops> last_flops(int64_t run);
  // Full T x T attention FLOPs of the run's model at its last record.
  std::optional<double> reference_attention_fwd(int64_t run);
  // Each operator's share at the last routing record, averaged over layers.
  std::map<std::string, double> last_shares(int64_t run);
  std::vector<std::pair<int64_t, double>> train_losses(int64_t run);  // (step, loss)
  std::vector<RoutingSeries> routing(int64_t run);                    // by layer, then operator
  std::vector<LayerHistogram> last_histograms(int64_t run);           // by layer
  StoreProvenance provenance();
  std::optional<RunLookup> find_run(const std::string& id_name_or_hash);
  // The checkpoint files recorded for a run, newest first (none in a store
  // from before schema 5).
  std::vector<CheckpointRecord> checkpoints(const std::string& hash, const std::string& kind);

 private:
  // A cached statement for one use: reset (its cursor closed, its read
  // transaction ended) when the use ends, however many rows were read.
  class Query {
   public:
    explicit Query(Statement& s) : s_(s) {}
    ~Query() { s_.reset(); }
    Query(const Query&) = delete;
    Query& operator=(const Query&) = delete;
    Statement* operator->() { return &s_; }
    Statement& operator*() { return s_; }

   private:
    Statement& s_;
  };
  Query query(const std::string& sql);  // prepared on first use
  bool has_column(const std::string& table, const std::string& column);
  std::string joined(const std::string& column);
  std::string counted(const std::string& expression);

  std::string file_;
  Store store_;
  std::map<std::string, std::unique_ptr<Statement>> prepared_;
  std::optional<bool> flops_flagged_;  // the flops table has schema 9's attention column
};

// The checkpoint record the database `db` holds for `file` (made absolute,
// as given or normalised), or nullopt when `db` is no store this harness
// can read or records no such file.
std::optional<CheckpointRecord> recorded_checkpoint(const std::string& db, const std::string& file);

// `chiar show` and `chiar export`: one row per finished run, its cells in
// the order of result_columns().
struct ResultColumn {
  std::string name;
  bool number = false;  // JSON writes it as a number (an empty cell is null either way)
};
std::vector<ResultColumn> result_columns();
struct ResultRow {
  std::vector<std::string> cells;  // one per result_columns() entry
};
// attn_gflops counts the FLOP rows flagged as attention, and an unflagged
// (pre-schema-9) row when its operator is in `attention_operators`: those
// whose loaded traits say they count as attention, as the report counts them.
std::vector<ResultRow> read_results(const std::string& db, const std::set<std::string>& attention_operators);

}  // namespace chiar::engine
