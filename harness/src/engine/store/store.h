#pragma once
// The results database of one matrix (SQLite, WAL, busy timeout, schema
// version with migrations). Every write is one transaction. Runs are keyed by
// the hash of their resolved spec: a finished run is never run again, and a
// run is claimed atomically so two processes never run the same one.
//
// A store carries a marker (PRAGMA application_id = kApplicationId); a store
// from before the marker is recognised by its meta and runs tables. chiar
// writes only to its own databases: only `chiar run` (StoreAccess::ReadWrite)
// creates a store, in a new file or an empty database, or migrates one; every
// other command opens it read-only, and any database that is not a store is
// refused without being changed.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/config/run_spec.h"
#include "engine/store/run_status.h"
#include "engine/store/sqlite.h"

namespace chiar::engine {

constexpr int kSchemaVersion = 9;
// The oldest schema read-only commands read without a migration.
constexpr int kOldestReadableSchema = 5;
// PRAGMA application_id of a chiar store: "chia" in ASCII.
constexpr int32_t kApplicationId = 0x63686961;

enum class StoreAccess {
  ReadWrite,  // `chiar run` (and test fixtures): creates, migrates and stamps
  ReadOnly,   // show, export, report, inspect: schema kOldestReadableSchema or later, nothing changed on disk
};

struct Provenance {
  std::string git_commit;  // the commit the binary was built from (engine/runtime/build_commit.h)
  bool git_dirty = false;  // built with tracked files differing from it
  std::string torch_version, blas, device, host, cpu, build_type, allocator;
  std::string gemm;  // the library behind the model's products, and why (configure_gemm)
  double gemm_gflops = 0;
  int threads = 0;
  int processes = 1;  // data-parallel ranks training the run (not part of its hash)
  int64_t pid = 0;
};

enum class ClaimOutcome {
  Claimed,  // this process runs it now (fresh, or resuming a dead or interrupted run)
  Done,     // finished before (done, failed or diverged): skip
  Busy,     // a live process is running it: skip
};

struct RunSummary {
  int64_t params = 0;
  double train_seconds = 0, train_tokens_per_s = 0, eval_tokens_per_s = 0, step_ms = 0, peak_rss_mb = 0;
  // The GPU caching allocator's high-water marks over the run; -1 (NULL in
  // the store) when it trained on no GPU (engine/runtime/gpu_memory.h).
  double peak_gpu_allocated_mb = -1, peak_gpu_reserved_mb = -1;
  std::string tau;          // thresholds in force, JSON
  std::string calibration;  // what calibrated them, JSON
  // Harness work during training (store writes, FLOP accounting, routing
  // statistics) as a fraction of the time spent in training steps; the
  // breakdown in seconds, checkpoints included, as JSON.
  double overhead_fraction = 0;
  std::string overhead;
  // Whether this process trained any step. A process that resumed after the
  // last step (to score the test split) measured no step: finish() then
  // keeps the timings an earlier process recorded.
  bool trained_steps = true;
};

// One row of a per-layer, per-operator FLOP record (FLOPs per sequence).
struct FlopRow {
  int64_t layer = 0;
  std::string op;
  double tokens = 0;          // tokens routed to op per sequence
  double fwd_executed = 0;    // forward FLOPs as executed (dense or sparse)
  double fwd_sparse = 0;      // forward FLOPs a sparse execution needs
  double train_executed = 0;  // forward + backward of a training step, as executed
  double train_sparse = 0;
  bool attention = false;  // op's traits count it as attention (OperatorTraits::attention_flops)
};

// A checkpoint file the store vouches for: recorded only once the file is
// complete, fsynced and renamed into place, with the size and checksum a
// later load verifies before trusting it.
struct CheckpointRecord {
  std::string kind;  // "state" (resumable training state) or "best" (best-validation model)
  int64_t step = 0;  // the training steps the file holds
  std::string file;  // absolute path
  int64_t bytes = 0;
  std::string checksum;  // "crc32:%08x" of the whole file
};

// The group-sequential design a store's runs are made by (`chiar run
// --decide`, schema 8): what was planned before the first run. Lists are
// JSON arrays.
struct SequentialDesignRecord;
// Whether two records are the same design (claims, baseline, seeds, rounds, tests).
bool same_design(const SequentialDesignRecord& a, const SequentialDesignRecord& b);

struct SequentialDesignRecord {
  std::string claims;    // the claims file, and its claim ids (JSON)
  std::string baseline;  // what "$baseline" named
  int64_t max_seeds = 0, rounds = 0, tests = 0;
  double alpha = 0.05;     // per comparison: 0.05 / tests
  std::string seeds;       // cumulative seeds at each look, e.g. "[4, 8, 12]"
  std::string boundaries;  // |Z| boundary at each look
  std::string nominal_p;   // the p below which each look decides
};

// One comparison at one look: what it was tested on and what followed.
struct SequentialLookRecord {
  int64_t round = 0;  // 0-based look
  std::string claim, task;
  int64_t seeds = 0;                                 // seeds the test had (paired: both variants finished)
  double p = 0, nominal = 0, conditional_power = 0;  // NaN where not computed
  std::string outcome;                               // continue | decided | futile | final
};

class Store {
 public:
  // ReadWrite: a missing file or an empty database becomes a store; a store
  // of an older schema is migrated. ReadOnly: the store must exist and be of
  // the current schema. Both refuse (UserError) a database that is not a store
  // or is of a newer schema, before anything is written.
  explicit Store(const std::string& file, StoreAccess access = StoreAccess::ReadWrite);
  // Refuses (UserError) what a ReadWrite Store would refuse of `file`, and
  // writes nothing: for a command that checks every store it will write
  // before it writes any.
  static void check_writable(const std::string& file) { admitted(file, StoreAccess::ReadWrite); }

  // Adds a pending row for every spec not yet in the database.
  void register_runs(const std::vector<RunSpec>& runs);
  // Replaces the record of every one of `runs` that ended failed (its row and
  // everything logged, measured or checkpointed under it) with a pending
  // row, as if new, in one transaction: `chiar run --retry-failed`. Returns
  // the names of the runs restarted. Their checkpoint files go when each is
  // claimed (a run that never started keeps none).
  std::vector<std::string> restart_failed(const std::vector<RunSpec>& runs);
  // Claims a run; `resumed` tells whether it had started before. A run
  // marked running is left to its process while that lives (same host: the
  // pid; another host: a heartbeat within 10 minutes); with sole_writer the
  // caller vouches that no other process writes this store, so such a run's
  // process is gone (a Slurm array task requeued, perhaps on another node).
  ClaimOutcome claim(const RunSpec& run, const Provenance& p, bool* resumed = nullptr, bool sole_writer = false);
  void heartbeat(const std::string& hash, int64_t step);
  // status: Done, Failed, Diverged or Interrupted.
  void finish(const std::string& hash, RunStatus status, const std::string& error, int64_t diverged_step,
              const RunSummary& summary);
  // The run's status; Pending for a hash the store does not hold.
  RunStatus status(const std::string& hash);
  // The product library an earlier process recorded for an unfinished run
  // (runs.gemm of a run 'running' or 'interrupted'); "" for any other.
  std::string recorded_gemm(const std::string& hash);

  void add_metrics(const std::string& hash, int64_t step, const std::string& split, const std::string& checkpoint,
                   const std::map<std::string, double>& values);
  void add_train_log(const std::string& hash, int64_t step, double loss, double lr, double tokens_per_s);
  void add_flops(const std::string& hash, int64_t step, const std::vector<FlopRow>& rows,
                 double reference_attention_fwd);
  void add_routing(const std::string& hash, int64_t step, int64_t layer,
                   const std::vector<std::pair<std::string, double>>& shares, const std::vector<int64_t>& histogram);

  // Records a checkpoint whose file is in place (schema 5).
  void record_checkpoint(const std::string& hash, const CheckpointRecord& c);
  // The run's recorded checkpoints of one kind, newest step first.
  std::vector<CheckpointRecord> checkpoints(const std::string& hash, const std::string& kind);
  // Drops the record of one checkpoint (its file was superseded or found corrupt).
  void forget_checkpoint(const std::string& hash, const std::string& kind, int64_t step);

  // The sequential design: saved once, before the first round's runs; saving
  // another over it is refused (UserError naming both).
  void save_sequential_design(const SequentialDesignRecord& d);
  // The same, inside a transaction the caller holds.
  void save_sequential_design_in_transaction(const SequentialDesignRecord& d);
  std::optional<SequentialDesignRecord> sequential_design();
  // A look, recorded after its round; the same look again replaces it.
  void record_look(const SequentialLookRecord& look);
  std::vector<SequentialLookRecord> looks();

  // Whether PRAGMA integrity_check finds nothing wrong.
  bool integrity_ok();

  Database& db() { return db_; }

 private:
  int64_t run_id(const std::string& hash);
  // Pending rows for the specs not yet in the database; inside a transaction.
  void insert_runs(const std::vector<RunSpec>& runs);
  void migrate();
  void add_column_if_missing(const std::string& table, const std::string& column);
  bool has_table(const std::string& name);
  void check_readable();
  static const std::string& admitted(const std::string& file, StoreAccess access);
  Database db_;
};

// What a store holds, read without changing the file, whatever schema
// version this harness can migrate: `chiar run --dry-run` and run's check that
// everything finished before. UserError for a database that is not a store
// or is of a newer schema.
struct StoredRuns {
  bool store = false;                       // false: no file, or an empty database (`chiar run` makes it a store)
  bool current = false;                     // marked and of this harness's schema: nothing to migrate
  std::map<std::string, RunStatus> status;  // by run hash
};
StoredRuns read_stored_runs(const std::string& file);

// Whether the database file passes PRAGMA integrity_check; opened read-only,
// changing nothing. False as well when it cannot be read as a database.
bool integrity_ok(const std::string& file);

}  // namespace chiar::engine
