#include "store.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <chrono>
#include <ctime>
#include <stdexcept>

#include <boost/filesystem.hpp>

#include "chiar/error.h"

namespace chiar::engine {
namespace {

const char* const kSchemaV1 = R"SQL(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs(
  id INTEGER PRIMARY KEY,
  hash TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL, matrix TEXT NOT NULL, variant TEXT NOT NULL, task TEXT NOT NULL,
  seed INTEGER NOT NULL, spec TEXT NOT NULL,
  status TEXT NOT NULL DEFAULT 'pending'
    CHECK(status IN ('pending','running','done','failed','diverged','interrupted')),
  error TEXT, diverged_step INTEGER, step INTEGER NOT NULL DEFAULT 0,
  created_at TEXT NOT NULL, started_at TEXT, finished_at TEXT, heartbeat REAL,
  host TEXT, pid INTEGER, git_commit TEXT, git_dirty INTEGER, torch_version TEXT, blas TEXT,
  gemm_gflops REAL, threads INTEGER, device TEXT, cpu TEXT, build_type TEXT, allocator TEXT,
  params INTEGER, train_seconds REAL, train_tokens_per_s REAL, eval_tokens_per_s REAL,
  step_ms REAL, peak_rss_mb REAL, tau TEXT, calibration TEXT);
CREATE TABLE IF NOT EXISTS metrics(
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, split TEXT NOT NULL,
  checkpoint TEXT NOT NULL, name TEXT NOT NULL, value REAL,
  PRIMARY KEY(run_id, step, split, checkpoint, name));
CREATE TABLE IF NOT EXISTS train_log(
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, loss REAL, lr REAL,
  tokens_per_s REAL, PRIMARY KEY(run_id, step));
CREATE TABLE IF NOT EXISTS flops(
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, layer INTEGER NOT NULL,
  operator TEXT NOT NULL, tokens REAL, fwd_executed REAL, fwd_sparse REAL,
  train_executed REAL, train_sparse REAL, PRIMARY KEY(run_id, step, layer, operator));
CREATE TABLE IF NOT EXISTS flops_reference(
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, attention_fwd REAL,
  PRIMARY KEY(run_id, step));
CREATE TABLE IF NOT EXISTS routing(
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, layer INTEGER NOT NULL,
  operator TEXT NOT NULL, share REAL, PRIMARY KEY(run_id, step, layer, operator));
CREATE TABLE IF NOT EXISTS histograms(
  run_id INTEGER NOT NULL REFERENCES runs(id), step INTEGER NOT NULL, layer INTEGER NOT NULL,
  bin INTEGER NOT NULL, lo REAL, hi REAL, count INTEGER,
  PRIMARY KEY(run_id, step, layer, bin));
)SQL";

// Schema 9's view (3 added the harness overhead, 9 counts attention by the
// flag each FLOP row records). Rows recorded before schema 9 have no flag:
// their runs show no attention_gflops here; `chiar show` and `export` count
// them by the loaded plugins' traits (engine/store/results.h).
const char* const kResultsView = R"SQL(
DROP VIEW IF EXISTS results;
-- The main metric of each finished run: test split, best-validation checkpoint.
CREATE VIEW results AS
SELECT r.id, r.name, r.variant, r.task, r.seed, r.status,
  (SELECT value FROM metrics m WHERE m.run_id = r.id AND m.split = 'test' AND m.checkpoint = 'best'
     AND m.name IN ('accuracy', 'token_ppl') ORDER BY m.step DESC LIMIT 1) AS main_metric,
  (SELECT name FROM metrics m WHERE m.run_id = r.id AND m.split = 'test' AND m.checkpoint = 'best'
     AND m.name IN ('accuracy', 'token_ppl') ORDER BY m.step DESC LIMIT 1) AS metric_name,
  (SELECT SUM(fwd_executed) / 1e9 FROM flops f WHERE f.run_id = r.id AND f.attention = 1
     AND f.step = (SELECT MAX(step) FROM flops g WHERE g.run_id = r.id)) AS attention_gflops,
  (SELECT SUM(fwd_executed) / 1e9 FROM flops f WHERE f.run_id = r.id
     AND f.step = (SELECT MAX(step) FROM flops g WHERE g.run_id = r.id)) AS total_gflops,
  r.train_tokens_per_s, r.eval_tokens_per_s, r.params, r.overhead_fraction
FROM runs r WHERE r.status IN ('done', 'diverged', 'failed');
)SQL";

// Schema 8: a group-sequential design and its looks (chiar run --decide).
const char* const kSequentialTables = R"SQL(
CREATE TABLE IF NOT EXISTS sequential_design(
  id INTEGER PRIMARY KEY CHECK(id = 1), claims TEXT NOT NULL, baseline TEXT NOT NULL,
  max_seeds INTEGER NOT NULL, rounds INTEGER NOT NULL, tests INTEGER NOT NULL, alpha REAL NOT NULL,
  seeds TEXT NOT NULL, boundaries TEXT NOT NULL, nominal_p TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sequential_looks(
  round INTEGER NOT NULL, claim TEXT NOT NULL, task TEXT NOT NULL, seeds INTEGER NOT NULL,
  p REAL, nominal REAL NOT NULL, conditional_power REAL,
  outcome TEXT NOT NULL CHECK(outcome IN ('continue','decided','futile','final')),
  PRIMARY KEY(round, claim, task));
)SQL";

const char* const kCheckpointsTable = R"SQL(
CREATE TABLE IF NOT EXISTS checkpoints(
  run_id INTEGER NOT NULL REFERENCES runs(id), kind TEXT NOT NULL CHECK(kind IN ('state','best')),
  step INTEGER NOT NULL, file TEXT NOT NULL, bytes INTEGER NOT NULL, checksum TEXT NOT NULL,
  written_at TEXT NOT NULL, PRIMARY KEY(run_id, kind, step));
)SQL";

std::string now_iso() {
  char buf[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// A "running" run whose process is gone: same host and the pid is dead, or
// another host that has not sent a heartbeat for 10 minutes.
bool is_dead(const std::string& host, int64_t pid, double heartbeat) {
  if (host == hostname()) return pid <= 0 || (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
  return now_seconds() - heartbeat > 600;
}

// What a database is, as far as chiar is concerned.
enum class DatabaseKind {
  Empty,    // no tables: `chiar run` may make it a store
  Store,    // marked, or a store from before the marker
  Foreign,  // anything else: never changed
};

struct Classified {
  DatabaseKind kind = DatabaseKind::Foreign;
  bool marked = false;  // application_id is kApplicationId
  int version = 0;      // meta.schema_version
};

[[noreturn]] void refuse_foreign(const std::string& file) {
  throw UserError(file + ": not a chiar store (no chiar schema marker); chiar writes only to its own databases");
}

[[noreturn]] void refuse_newer(const std::string& file, int version) {
  throw UserError(file + ": schema version " + std::to_string(version) + " is newer than this harness's " +
                  std::to_string(kSchemaVersion));
}

// The schema version a store's meta table holds; 0 without one.
int stored_schema_version(Database& db) {
  auto q = db.prepare("SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'schema_version'");
  return q.step() ? static_cast<int>(q.integer(0)) : 0;
}

Classified classify_tables(Database& db) {
  Classified c;
  int64_t application_id = 0;
  {
    auto q = db.prepare("PRAGMA application_id");
    if (q.step()) application_id = q.integer(0);
  }
  c.marked = application_id == kApplicationId;
  bool has_meta = false, has_runs = false, empty = true;
  {
    auto q = db.prepare("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')");
    while (q.step()) {
      empty = false;
      has_meta |= q.text(0) == "meta";
      has_runs |= q.text(0) == "runs";
    }
  }
  if (application_id != 0 && !c.marked) return c;  // another application's database
  if (empty) {
    c.kind = DatabaseKind::Empty;
    return c;
  }
  if (c.marked) {
    c.kind = DatabaseKind::Store;
    c.version = has_meta ? stored_schema_version(db) : 0;
    return c;
  }
  // A store from before the marker: meta with a schema version, and runs.
  if (!has_meta || !has_runs) return c;
  try {
    c.version = stored_schema_version(db);
  } catch (const UserError&) {
    return c;  // a meta table of another shape
  }
  if (c.version > 0) c.kind = DatabaseKind::Store;
  return c;
}

// Reads only; a file SQLite cannot read as a database is foreign.
Classified classify(Database& db) {
  try {
    return classify_tables(db);
  } catch (const UserError&) {
    if (db.last_error() == SQLITE_NOTADB) return {};
    throw;
  }
}

}  // namespace

// Refuses a foreign or newer database before a read-write connection (whose
// first read could already create -wal and -shm files beside it) is opened.
const std::string& Store::admitted(const std::string& file, StoreAccess access) {
  if (access == StoreAccess::ReadOnly || !boost::filesystem::exists(file)) return file;
  Database probe(file, OpenMode::ReadOnly);
  const Classified c = classify(probe);
  if (c.kind == DatabaseKind::Foreign) refuse_foreign(file);
  if (c.kind == DatabaseKind::Store && c.version > kSchemaVersion) refuse_newer(file, c.version);
  return file;
}

Store::Store(const std::string& file, StoreAccess access)
    : db_(admitted(file, access), access == StoreAccess::ReadOnly ? OpenMode::ReadOnly : OpenMode::ReadWrite) {
  if (access == StoreAccess::ReadOnly)
    check_readable();
  else
    migrate();
}

void Store::check_readable() {
  const Classified c = classify(db_);
  if (c.kind != DatabaseKind::Store) refuse_foreign(db_.file());
  if (c.version > kSchemaVersion) refuse_newer(db_.file(), c.version);
  // Schema 6 only added a column no reader needs: a schema-5 store (a shard
  // written by the previous release, say) is read as it is.
  if (c.version < kOldestReadableSchema)
    throw UserError(db_.file() + ": schema version " + std::to_string(c.version) + " is older than this harness's " +
                    std::to_string(kSchemaVersion) + "; `chiar run` on its matrix migrates it");
}

// Under the write lock, so processes creating one store together see it
// either untouched or complete; a store already current is left as it is.
void Store::migrate() {
  db_.transaction([&] {
    const Classified c = classify(db_);
    if (c.kind == DatabaseKind::Foreign) refuse_foreign(db_.file());
    const int version = c.kind == DatabaseKind::Store ? c.version : 0;
    if (version > kSchemaVersion) refuse_newer(db_.file(), version);
    if (version == kSchemaVersion && c.marked) return;
    if (version < 1) db_.exec(kSchemaV1);
    // 2: the resolved spec as TOML, so a run's model can be rebuilt (chiar inspect).
    if (version < 2) db_.exec("ALTER TABLE runs ADD COLUMN spec_toml TEXT");
    // 3: the harness overhead of each run, and the results view showing it.
    if (version < 3) {
      db_.exec("ALTER TABLE runs ADD COLUMN overhead_fraction REAL");
      db_.exec("ALTER TABLE runs ADD COLUMN overhead TEXT");
    }
    // 4: which library ran the model's products (gemm_gflops is that library's rate).
    if (version < 4) db_.exec("ALTER TABLE runs ADD COLUMN gemm TEXT");
    // 5: the checkpoint files of each run, recorded after they are in place.
    if (version < 5) db_.exec(kCheckpointsTable);
    // and the task family of each run (metadata that claims match); a store
    // of schema 5 made before the column existed has the table only.
    if (version < 6) add_column_if_missing("runs", "task_family TEXT");
    // 6: how many data-parallel processes trained each run.
    if (version < 6) add_column_if_missing("runs", "processes INTEGER");
    // 7: the GPU caching allocator's peaks (NULL for runs on the CPU).
    if (version < 7) {
      add_column_if_missing("runs", "peak_gpu_allocated_mb REAL");
      add_column_if_missing("runs", "peak_gpu_reserved_mb REAL");
    }
    // 8: a group-sequential design and its looks.
    if (version < 8) db_.exec(kSequentialTables);
    // 9: whether each FLOP row's operator counts as attention (its traits),
    // and the results view counting by it; older rows keep NULL.
    if (version < 9) {
      add_column_if_missing("flops", "attention INTEGER");
      db_.exec(kResultsView);
    }
    if (!c.marked) db_.exec("PRAGMA application_id = " + std::to_string(kApplicationId));
    db_.prepare("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)")
        .bind(1, std::to_string(kSchemaVersion))
        .run();
  });
}

// Adds a column to `table` unless it is there ("name TYPE"): a store a
// newer harness migrated, then marked older by hand, keeps its columns.
void Store::add_column_if_missing(const std::string& table, const std::string& column) {
  const std::string name = column.substr(0, column.find(' '));
  auto has = db_.prepare("SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?");
  has.bind_all(table, name);
  if (has.step() && has.integer(0) == 0) db_.exec("ALTER TABLE " + table + " ADD COLUMN " + column);
}

bool Store::integrity_ok() {
  try {
    auto q = db_.prepare("PRAGMA integrity_check");
    return q.step() && q.text(0) == "ok" && !q.step();
  } catch (const UserError&) {
    return false;  // SQLITE_CORRUPT and the like
  }
}

StoredRuns read_stored_runs(const std::string& file) {
  StoredRuns out;
  if (!boost::filesystem::exists(file)) return out;
  Database db(file, OpenMode::ReadOnly);
  const Classified c = classify(db);
  if (c.kind == DatabaseKind::Empty) return out;
  if (c.kind == DatabaseKind::Foreign) refuse_foreign(file);
  if (c.version > kSchemaVersion) refuse_newer(file, c.version);
  out.store = true;
  out.current = c.marked && c.version == kSchemaVersion;
  auto q = db.prepare("SELECT hash, status FROM runs");
  while (q.step()) out.status[q.text(0)] = run_status_from_string(q.text(1));
  return out;
}

bool integrity_ok(const std::string& file) {
  try {
    Database db(file, OpenMode::ReadOnly);
    auto q = db.prepare("PRAGMA integrity_check");
    return q.step() && q.text(0) == "ok" && !q.step();
  } catch (const std::exception&) {
    return false;  // missing, unreadable or not a database
  }
}

bool same_design(const SequentialDesignRecord& a, const SequentialDesignRecord& b) {
  return a.claims == b.claims && a.baseline == b.baseline && a.max_seeds == b.max_seeds && a.rounds == b.rounds &&
         a.tests == b.tests && a.seeds == b.seeds;
}

void Store::save_sequential_design(const SequentialDesignRecord& d) {
  db_.transaction([&] { save_sequential_design_in_transaction(d); });
}

void Store::save_sequential_design_in_transaction(const SequentialDesignRecord& d) {
  {
    if (const auto held = sequential_design()) {
      if (same_design(*held, d)) return;
      throw UserError(db_.file() + ": holds runs of another sequential design (" + std::to_string(held->max_seeds) +
                      " seeds in " + std::to_string(held->rounds) + " rounds over " + std::to_string(held->tests) +
                      " tests, claims " + held->claims + "); a new design needs a new store (--db)");
    }
    db_.prepare(
           "INSERT INTO sequential_design(id, claims, baseline, max_seeds, rounds, tests, alpha, seeds, boundaries, "
           "nominal_p, created_at) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
        .bind_all(d.claims, d.baseline, d.max_seeds, d.rounds, d.tests, d.alpha, d.seeds, d.boundaries, d.nominal_p,
                  now_iso())
        .run();
  }
}

// Whether the store has a table: a store of schema 5 to 7, read as it is,
// has no sequential tables.
bool Store::has_table(const std::string& name) {
  auto q = db_.prepare("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?");
  q.bind(1, name);
  return q.step() && q.integer(0) > 0;
}

std::optional<SequentialDesignRecord> Store::sequential_design() {
  if (!has_table("sequential_design")) return std::nullopt;
  auto q = db_.prepare(
      "SELECT claims, baseline, max_seeds, rounds, tests, alpha, seeds, boundaries, nominal_p FROM sequential_design");
  if (!q.step()) return std::nullopt;
  SequentialDesignRecord d;
  d.claims = q.text(0);
  d.baseline = q.text(1);
  d.max_seeds = q.integer(2);
  d.rounds = q.integer(3);
  d.tests = q.integer(4);
  d.alpha = q.real(5);
  d.seeds = q.text(6);
  d.boundaries = q.text(7);
  d.nominal_p = q.text(8);
  return d;
}

void Store::record_look(const SequentialLookRecord& l) {
  auto q = db_.prepare(
      "INSERT OR REPLACE INTO sequential_looks(round, claim, task, seeds, p, nominal, conditional_power, outcome) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  q.bind_all(l.round, l.claim, l.task, l.seeds);
  std::isfinite(l.p) ? q.bind(5, l.p) : q.bind_null(5);
  q.bind(6, l.nominal);
  std::isfinite(l.conditional_power) ? q.bind(7, l.conditional_power) : q.bind_null(7);
  q.bind(8, l.outcome).run();
}

std::vector<SequentialLookRecord> Store::looks() {
  std::vector<SequentialLookRecord> out;
  if (!has_table("sequential_looks")) return out;
  auto q = db_.prepare(
      "SELECT round, claim, task, seeds, p, nominal, conditional_power, outcome FROM sequential_looks "
      "ORDER BY round, claim, task");
  while (q.step()) {
    SequentialLookRecord l;
    l.round = q.integer(0);
    l.claim = q.text(1);
    l.task = q.text(2);
    l.seeds = q.integer(3);
    l.p = q.is_null(4) ? NAN : q.real(4);
    l.nominal = q.real(5);
    l.conditional_power = q.is_null(6) ? NAN : q.real(6);
    l.outcome = q.text(7);
    out.push_back(l);
  }
  return out;
}

void Store::insert_runs(const std::vector<RunSpec>& runs) {
  // The family is metadata outside the hash: a later matrix may name it.
  auto insert = db_.prepare(
      "INSERT INTO runs(hash, name, matrix, variant, task, seed, spec, spec_toml, created_at, task_family) "
      "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULLIF(?, '')) "
      "ON CONFLICT(hash) DO UPDATE SET task_family = COALESCE(excluded.task_family, task_family)");
  const std::string now = now_iso();
  for (const auto& r : runs) {
    insert.bind_all(r.hash, r.name(), r.matrix, r.variant, r.task, r.seed, r.canonical, r.resolved_toml, now,
                    r.task_family);
    insert.run();
    insert.reset();
  }
}

void Store::register_runs(const std::vector<RunSpec>& runs) {
  db_.transaction([&] { insert_runs(runs); });
}

std::vector<std::string> Store::restart_failed(const std::vector<RunSpec>& runs) {
  std::vector<std::string> restarted;
  db_.transaction([&] {
    std::vector<RunSpec> failed_runs;
    auto failed = db_.prepare("SELECT id FROM runs WHERE hash = ? AND status = 'failed'");
    for (const auto& r : runs) {
      failed.bind(1, r.hash);
      const bool was_failed = failed.step();
      const int64_t id = was_failed ? failed.integer(0) : -1;
      failed.reset();
      if (!was_failed) continue;
      for (const char* table :
           {"metrics", "train_log", "flops", "flops_reference", "routing", "histograms", "checkpoints"})
        db_.prepare(std::string("DELETE FROM ") + table + " WHERE run_id = ?").bind(1, id).run();
      db_.prepare("DELETE FROM runs WHERE id = ?").bind(1, id).run();
      failed_runs.push_back(r);
      restarted.push_back(r.name());
    }
    // Back in the same transaction: no other process on the store ever
    // finds the run missing.
    insert_runs(failed_runs);
  });
  return restarted;
}

ClaimOutcome Store::claim(const RunSpec& run, const Provenance& p, bool* resumed, bool sole_writer) {
  ClaimOutcome result = ClaimOutcome::Busy;
  db_.transaction([&] {
    auto q = db_.prepare("SELECT status, host, pid, heartbeat, started_at FROM runs WHERE hash = ?");
    q.bind(1, run.hash);
    if (!q.step()) throw UserError(db_.file() + ": run " + run.hash + " is not registered");
    const RunStatus status = run_status_from_string(q.text(0));
    if (is_final(status)) {
      result = ClaimOutcome::Done;
      return;
    }
    if (status == RunStatus::Running && !sole_writer && !is_dead(q.text(1), q.integer(2), q.real(3))) {
      result = ClaimOutcome::Busy;
      return;
    }
    if (resumed) *resumed = !q.is_null(4);
    db_.prepare(
           "UPDATE runs SET status = 'running', error = NULL, host = ?, pid = ?, heartbeat = ?, "
           "started_at = COALESCE(started_at, ?), git_commit = ?, git_dirty = ?, torch_version = ?, "
           "blas = ?, gemm_gflops = ?, threads = ?, device = ?, cpu = ?, build_type = ?, allocator = ?, "
           "gemm = ?, processes = ? WHERE hash = ?")
        .bind_all(p.host, p.pid, now_seconds(), now_iso(), p.git_commit, int64_t{p.git_dirty}, p.torch_version, p.blas,
                  p.gemm_gflops, int64_t{p.threads}, p.device, p.cpu, p.build_type, p.allocator, p.gemm,
                  int64_t{p.processes}, run.hash)
        .run();
    result = ClaimOutcome::Claimed;
  });
  return result;
}

void Store::heartbeat(const std::string& hash, int64_t step) {
  db_.transaction([&] {
    db_.prepare("UPDATE runs SET heartbeat = ?, step = ? WHERE hash = ?").bind_all(now_seconds(), step, hash).run();
  });
}

void Store::finish(const std::string& hash, RunStatus status, const std::string& error, int64_t diverged_step,
                   const RunSummary& s) {
  db_.transaction([&] {
    auto u = db_.prepare(
        "UPDATE runs SET status = ?, error = ?, diverged_step = ?, finished_at = ?, params = ?, "
        "train_seconds = ?, train_tokens_per_s = COALESCE(?, train_tokens_per_s), eval_tokens_per_s = ?, "
        "step_ms = COALESCE(?, step_ms), peak_rss_mb = COALESCE(?, peak_rss_mb), tau = ?, "
        "calibration = COALESCE(NULLIF(?, ''), calibration), overhead_fraction = COALESCE(?, overhead_fraction), "
        "overhead = COALESCE(?, overhead), peak_gpu_allocated_mb = COALESCE(?, peak_gpu_allocated_mb), "
        "peak_gpu_reserved_mb = COALESCE(?, peak_gpu_reserved_mb) WHERE hash = ?");
    u.bind(1, to_string(status));
    if (error.empty())
      u.bind_null(2);
    else
      u.bind(2, error);
    if (diverged_step < 0)
      u.bind_null(3);
    else
      u.bind(3, diverged_step);
    u.bind(4, now_iso())
        .bind(5, s.params)
        .bind(6, s.train_seconds)
        .bind(8, s.eval_tokens_per_s)
        .bind(11, s.tau)
        .bind(12, s.calibration)
        .bind(17, hash);
    if (s.trained_steps) {
      u.bind(7, s.train_tokens_per_s)
          .bind(9, s.step_ms)
          .bind(10, s.peak_rss_mb)
          .bind(13, s.overhead_fraction)
          .bind(14, s.overhead);
    } else {
      for (int column : {7, 9, 10, 13, 14}) u.bind_null(column);
    }
    // Like the other peaks, kept from an earlier process when this one trained no step.
    if (s.trained_steps && s.peak_gpu_allocated_mb >= 0) {
      u.bind(15, s.peak_gpu_allocated_mb).bind(16, s.peak_gpu_reserved_mb);
    } else {
      u.bind_null(15).bind_null(16);
    }
    u.run();
  });
}

RunStatus Store::status(const std::string& hash) {
  auto q = db_.prepare("SELECT status FROM runs WHERE hash = ?");
  q.bind(1, hash);
  return q.step() ? run_status_from_string(q.text(0)) : RunStatus::Pending;
}

std::string Store::recorded_gemm(const std::string& hash) {
  auto q =
      db_.prepare("SELECT gemm FROM runs WHERE hash = ? AND status IN ('running', 'interrupted') AND gemm IS NOT NULL");
  q.bind(1, hash);
  return q.step() ? q.text(0) : "";
}

const char* to_string(RunStatus s) {
  switch (s) {
    case RunStatus::Pending: return "pending";
    case RunStatus::Running: return "running";
    case RunStatus::Done: return "done";
    case RunStatus::Failed: return "failed";
    case RunStatus::Diverged: return "diverged";
    case RunStatus::Interrupted: return "interrupted";
  }
  return "?";
}

RunStatus run_status_from_string(const std::string& text) {
  for (RunStatus s : {RunStatus::Pending, RunStatus::Running, RunStatus::Done, RunStatus::Failed, RunStatus::Diverged,
                      RunStatus::Interrupted})
    if (text == to_string(s)) return s;
  throw std::logic_error("runs.status holds '" + text + "', which the store's CHECK constraint forbids");
}

int64_t Store::run_id(const std::string& hash) {
  auto q = db_.prepare("SELECT id FROM runs WHERE hash = ?");
  q.bind(1, hash);
  if (!q.step()) throw UserError(db_.file() + ": no run " + hash);
  return q.integer(0);
}

void Store::add_metrics(const std::string& hash, int64_t step, const std::string& split, const std::string& checkpoint,
                        const std::map<std::string, double>& values) {
  const int64_t id = run_id(hash);
  db_.transaction([&] {
    auto ins = db_.prepare("INSERT OR REPLACE INTO metrics VALUES (?, ?, ?, ?, ?, ?)");
    for (const auto& [name, value] : values) {
      ins.bind_all(id, step, split, checkpoint, name, value);
      ins.run();
      ins.reset();
    }
  });
}

void Store::add_train_log(const std::string& hash, int64_t step, double loss, double lr, double tps) {
  const int64_t id = run_id(hash);
  db_.transaction([&] {
    db_.prepare("INSERT OR REPLACE INTO train_log VALUES (?, ?, ?, ?, ?)").bind_all(id, step, loss, lr, tps).run();
  });
}

void Store::add_flops(const std::string& hash, int64_t step, const std::vector<FlopRow>& rows,
                      double reference_attention_fwd) {
  const int64_t id = run_id(hash);
  db_.transaction([&] {
    auto ins = db_.prepare(
        "INSERT OR REPLACE INTO flops(run_id, step, layer, operator, tokens, fwd_executed, fwd_sparse, "
        "train_executed, train_sparse, attention) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    for (const auto& r : rows) {
      ins.bind_all(id, step, r.layer, r.op, r.tokens, r.fwd_executed, r.fwd_sparse, r.train_executed, r.train_sparse,
                   int64_t{r.attention});
      ins.run();
      ins.reset();
    }
    db_.prepare("INSERT OR REPLACE INTO flops_reference VALUES (?, ?, ?)")
        .bind_all(id, step, reference_attention_fwd)
        .run();
  });
}

void Store::add_routing(const std::string& hash, int64_t step, int64_t layer,
                        const std::vector<std::pair<std::string, double>>& shares,
                        const std::vector<int64_t>& histogram) {
  const int64_t id = run_id(hash);
  db_.transaction([&] {
    auto ins = db_.prepare("INSERT OR REPLACE INTO routing VALUES (?, ?, ?, ?, ?)");
    for (const auto& [op, share] : shares) {
      ins.bind_all(id, step, layer, op, share);
      ins.run();
      ins.reset();
    }
    auto hist = db_.prepare("INSERT OR REPLACE INTO histograms VALUES (?, ?, ?, ?, ?, ?, ?)");
    const double width = 1.0 / static_cast<double>(histogram.size());
    for (size_t b = 0; b < histogram.size(); ++b) {
      hist.bind_all(id, step, layer, static_cast<int64_t>(b), width * static_cast<double>(b),
                    width * static_cast<double>(b + 1), histogram[b]);
      hist.run();
      hist.reset();
    }
  });
}

void Store::record_checkpoint(const std::string& hash, const CheckpointRecord& c) {
  const int64_t id = run_id(hash);
  db_.transaction([&] {
    db_.prepare("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?, ?, ?)")
        .bind_all(id, c.kind, c.step, c.file, c.bytes, c.checksum, now_iso())
        .run();
  });
}

std::vector<CheckpointRecord> Store::checkpoints(const std::string& hash, const std::string& kind) {
  auto q = db_.prepare(
      "SELECT c.kind, c.step, c.file, c.bytes, c.checksum FROM checkpoints c JOIN runs r ON r.id = c.run_id "
      "WHERE r.hash = ? AND c.kind = ? ORDER BY c.step DESC");
  q.bind(1, hash).bind(2, kind);
  std::vector<CheckpointRecord> out;
  while (q.step()) out.push_back({q.text(0), q.integer(1), q.text(2), q.integer(3), q.text(4)});
  return out;
}

void Store::forget_checkpoint(const std::string& hash, const std::string& kind, int64_t step) {
  const int64_t id = run_id(hash);
  db_.transaction([&] {
    db_.prepare("DELETE FROM checkpoints WHERE run_id = ? AND kind = ? AND step = ?").bind_all(id, kind, step).run();
  });
}

}  // namespace chiar::engine
