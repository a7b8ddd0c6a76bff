#include "results.h"

#include <array>
#include <iomanip>
#include <sstream>
#include <string_view>

#include <boost/filesystem.hpp>

#include "chiar/error.h"

namespace chiar::engine {

ResultsReader::ResultsReader(const std::string& file) : file_(file), store_(file, StoreAccess::ReadOnly) {}
ResultsReader::~ResultsReader() = default;

const std::string& ResultsReader::file() const { return file_; }

ResultsReader::Query ResultsReader::query(const std::string& sql) {
  auto& slot = prepared_[sql];
  if (!slot) slot = std::make_unique<Statement>(store_.db().prepare(sql));
  return Query(*slot);
}

bool ResultsReader::has_column(const std::string& table, const std::string& column) {
  auto q = query("SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = ?");
  q->bind_all(table, column);
  return q->step() && q->integer(0) > 0;
}

std::vector<StoredRun> ResultsReader::runs() {
  // A store of schema 5 read as it is lacks the columns of 6 and 7.
  const auto column = [&](const std::string& name, const std::string& otherwise) {
    return has_column("runs", name) ? "COALESCE(" + name + ", " + otherwise + ")" : otherwise;
  };
  auto q = query(
      "SELECT id, name, variant, task, seed, status, COALESCE(error, ''), COALESCE(diverged_step, -1), "
      "COALESCE(params, 0), COALESCE(train_tokens_per_s, 0), COALESCE(eval_tokens_per_s, 0), COALESCE(tau, ''), " +
      column("task_family", "''") + ", COALESCE(step_ms, 0), " + column("peak_gpu_allocated_mb", "-1") + ", " +
      column("peak_gpu_reserved_mb", "-1") +
      ", COALESCE(git_commit, ''), COALESCE(git_dirty, 0), COALESCE(gemm, ''), COALESCE(device, ''), "
      "COALESCE(cpu, ''), COALESCE(threads, 0), " +
      column("processes", "1") + " FROM runs ORDER BY id");
  std::vector<StoredRun> out;
  while (q->step()) {
    StoredRun r;
    r.id = q->integer(0);
    r.name = q->text(1);
    r.variant = q->text(2);
    r.task = q->text(3);
    r.seed = q->integer(4);
    r.status = run_status_from_string(q->text(5));
    r.error = q->text(6);
    r.diverged_step = q->integer(7);
    r.params = q->integer(8);
    r.train_tps = q->real(9);
    r.eval_tps = q->real(10);
    r.tau = q->text(11);
    r.family = q->text(12);
    r.step_ms = q->real(13);
    r.gpu_allocated_mb = q->real(14);
    r.gpu_reserved_mb = q->real(15);
    r.commit = q->text(16);
    r.dirty = q->integer(17) != 0;
    const std::string gemm = q->text(18), device = q->text(19), cpu = q->text(20);
    const int64_t processes = q->integer(22);
    r.gemm = gemm.substr(0, gemm.find(':'));  // "onednn: oneDNN 2.6.3 sgemm; ..." -> "onednn"
    if (!device.empty() || !cpu.empty())
      r.timing_setup = device + ", " + cpu + ", " + std::to_string(q->integer(21)) + " threads, " +
                       std::to_string(processes) + (processes == 1 ? " process, " : " processes, ") + gemm;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::string> ResultsReader::variants() {
  auto q = query("SELECT DISTINCT variant FROM runs ORDER BY variant");
  std::vector<std::string> out;
  while (q->step()) out.push_back(q->text(0));
  return out;
}

int64_t ResultsReader::run_count() {
  auto q = query("SELECT COUNT(*) FROM runs");
  return q->step() ? q->integer(0) : 0;
}

void ResultsReader::test_metrics(int64_t run, std::map<std::string, double>& best,
                                 std::map<std::string, double>& last) {
  auto q = query("SELECT checkpoint, name, value FROM metrics WHERE run_id = ? AND split = 'test'");
  q->bind(1, run);
  while (q->step()) (q->text(0) == "best" ? best : last)[q->text(1)] = q->real(2);
}

MetricsByStep ResultsReader::validation_metrics(int64_t run, const std::vector<std::string>& names) {
  std::string listed;
  for (size_t i = 0; i < names.size(); ++i) listed += (i ? ", ?" : "?") + std::to_string(i + 2);
  auto q = query(
      "SELECT step, name, value FROM metrics WHERE run_id = ?1 AND split = 'valid' AND checkpoint = 'current' "
      "AND name IN (" +
      listed + ") ORDER BY step");
  q->bind(1, run);
  for (size_t i = 0; i < names.size(); ++i) q->bind(static_cast<int>(i) + 2, names[i]);
  MetricsByStep out;
  while (q->step()) out[q->integer(0)][q->text(1)] = q->real(2);
  return out;
}

std::vector<OperatorFlops> ResultsReader::last_flops(int64_t run) {
  // A store of schema 5 to 8 read as it is has no flag: each row then asks
  // the loaded traits (OperatorFlops::counts_as_attention).
  if (!flops_flagged_) flops_flagged_ = has_column("flops", "attention");
  const std::string flag = *flops_flagged_ ? "MAX(attention)" : "NULL";
  auto q = query("SELECT operator, " + flag +
                 ", SUM(fwd_executed), SUM(fwd_sparse), SUM(train_executed) FROM flops WHERE run_id = ?1 AND "
                 "step = (SELECT MAX(step) FROM flops WHERE run_id = ?1) GROUP BY operator ORDER BY operator");
  q->bind(1, run);
  std::vector<OperatorFlops> out;
  while (q->step()) {
    OperatorFlops f;
    f.op = q->text(0);
    if (!q->is_null(1)) f.attention = q->integer(1) != 0;
    f.fwd_executed = q->real(2);
    f.fwd_sparse = q->real(3);
    f.train_executed = q->real(4);
    out.push_back(std::move(f));
  }
  return out;
}

std::optional<double> ResultsReader::reference_attention_fwd(int64_t run) {
  auto q = query("SELECT attention_fwd FROM flops_reference WHERE run_id = ? ORDER BY step DESC LIMIT 1");
  q->bind(1, run);
  if (q->step() && !q->is_null(0)) return q->real(0);
  return std::nullopt;
}

std::map<std::string, double> ResultsReader::last_shares(int64_t run) {
  auto q = query(
      "SELECT operator, AVG(share) FROM routing WHERE run_id = ?1 AND "
      "step = (SELECT MAX(step) FROM routing WHERE run_id = ?1) GROUP BY operator");
  q->bind(1, run);
  std::map<std::string, double> out;
  while (q->step()) out[q->text(0)] = q->real(1);
  return out;
}

std::vector<std::pair<int64_t, double>> ResultsReader::train_losses(int64_t run) {
  auto q = query("SELECT step, loss FROM train_log WHERE run_id = ? ORDER BY step");
  q->bind(1, run);
  std::vector<std::pair<int64_t, double>> out;
  while (q->step()) out.emplace_back(q->integer(0), q->real(1));
  return out;
}

std::vector<RoutingSeries> ResultsReader::routing(int64_t run) {
  auto q = query("SELECT layer, operator, step, share FROM routing WHERE run_id = ? ORDER BY layer, operator, step");
  q->bind(1, run);
  std::vector<RoutingSeries> out;
  while (q->step()) {
    const int64_t layer = q->integer(0);
    const std::string op = q->text(1);
    if (out.empty() || out.back().layer != layer || out.back().op != op) out.push_back({layer, op, {}});
    out.back().shares.emplace_back(q->integer(2), q->real(3));
  }
  return out;
}

std::vector<LayerHistogram> ResultsReader::last_histograms(int64_t run) {
  auto q = query(
      "SELECT layer, lo, hi, count FROM histograms WHERE run_id = ?1 AND "
      "step = (SELECT MAX(step) FROM histograms WHERE run_id = ?1) ORDER BY layer, bin");
  q->bind(1, run);
  std::vector<LayerHistogram> out;
  while (q->step()) {
    const int64_t layer = q->integer(0);
    if (out.empty() || out.back().layer != layer) out.push_back({layer, {}});
    out.back().bins.push_back({q->real(1), q->real(2), q->integer(3)});
  }
  return out;
}

// The distinct values of a runs column, "; "-separated.
std::string ResultsReader::joined(const std::string& column) {
  auto q = query("SELECT DISTINCT " + column + " FROM runs WHERE " + column + " IS NOT NULL ORDER BY 1");
  std::string out;
  while (q->step()) out += (out.empty() ? "" : "; ") + q->text(0);
  return out;
}

// The distinct non-empty values of `expression` over runs, in the order runs
// first had them, each with its number of runs when there is more than one:
// a store filled over several sittings says which runs came from which commit.
std::string ResultsReader::counted(const std::string& expression) {
  auto q = query("SELECT " + expression + ", COUNT(*), MIN(COALESCE(started_at, created_at)) FROM runs WHERE " +
                 expression + " <> '' GROUP BY 1 ORDER BY 3, 1");
  std::vector<std::pair<std::string, int64_t>> values;
  while (q->step()) values.emplace_back(q->text(0), q->integer(1));
  std::string out;
  for (const auto& [value, runs] : values) {
    out += (out.empty() ? "" : "; ") + value;
    if (values.size() > 1) out += " (" + std::to_string(runs) + (runs == 1 ? " run)" : " runs)");
  }
  return out;
}

StoreProvenance ResultsReader::provenance() {
  StoreProvenance p;
  p.commits = counted("substr(git_commit, 1, 12) || CASE WHEN git_dirty THEN ' with uncommitted changes' ELSE '' END");
  p.torch = joined("torch_version");
  p.blas = joined("blas");
  // `auto` appends the rates it measured in that process (configure_gemm in
  // engine/runtime/runtime.cpp), different in every run: the footer names the
  // product library it chose, and the rates stay in each run's gemm column.
  p.gemm = counted(
      "CASE WHEN blas IS NULL THEN NULL WHEN instr(gemm, '; auto: ') > 0 "
      "THEN substr(gemm, 1, instr(gemm, '; auto: ') - 1) || ' (chosen by auto)' "
      "ELSE COALESCE(gemm, 'blas (recorded before schema 4)') END");
  p.threads = joined("threads");
  p.hosts = joined("host");
  p.cpus = joined("cpu");
  p.devices = joined("device");
  p.allocators = joined("allocator");
  p.matrices = joined("matrix");
  auto dates = query("SELECT MIN(started_at), MAX(finished_at) FROM runs");
  if (dates->step()) p.first = dates->text(0), p.last = dates->text(1);
  auto cost = query("SELECT COUNT(*), COALESCE(SUM(train_seconds), 0) FROM runs WHERE status = 'done'");
  if (cost->step()) p.finished_runs = cost->integer(0), p.training_hours = cost->real(1) / 3600;
  return p;
}

std::optional<RunLookup> ResultsReader::find_run(const std::string& key) {
  auto q = query(
      "SELECT hash, status, COALESCE(spec_toml, '') FROM runs WHERE CAST(id AS TEXT) = ?1 OR name = ?1 OR hash = ?1");
  q->bind(1, key);
  if (!q->step()) return std::nullopt;
  return RunLookup{q->text(0), q->text(1), q->text(2)};
}

std::vector<CheckpointRecord> ResultsReader::checkpoints(const std::string& hash, const std::string& kind) {
  auto has_table = query("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'");
  if (!has_table->step()) return {};  // a store from before schema 5
  auto q = query(
      "SELECT c.kind, c.step, c.file, c.bytes, c.checksum FROM checkpoints c JOIN runs r ON r.id = c.run_id "
      "WHERE r.hash = ? AND c.kind = ? ORDER BY c.step DESC");
  q->bind_all(hash, kind);
  std::vector<CheckpointRecord> out;
  while (q->step()) out.push_back({q->text(0), q->integer(1), q->text(2), q->integer(3), q->text(4)});
  return out;
}

std::optional<CheckpointRecord> recorded_checkpoint(const std::string& db, const std::string& file) {
  std::unique_ptr<Database> con;
  try {
    con = std::make_unique<Database>(db, OpenMode::ReadOnly);
    auto has_table = con->prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'");
    if (!has_table.step()) return std::nullopt;  // a store from before schema 5
  } catch (const UserError&) {
    return std::nullopt;  // not a database this harness can read: nothing recorded
  }
  // From here a failure (a locked or damaged store) is an error, not "unrecorded".
  auto q = con->prepare("SELECT kind, step, file, bytes, checksum FROM checkpoints WHERE file = ?1 OR file = ?2");
  const boost::filesystem::path path = boost::filesystem::absolute(file);
  q.bind_all(path.string(), path.lexically_normal().string());
  if (q.step()) return CheckpointRecord{q.text(0), q.integer(1), q.text(2), q.integer(3), q.text(4)};
  return std::nullopt;
}

namespace {

// How a results cell is written.
enum class CellFormat {
  Text,         // as stored
  Significant,  // 5 significant digits
  Whole,        // fixed, no decimals
  Hundredths,   // fixed, 2 decimals
};

// One column of the results table: its header, where its value comes from
// (an SQL expression over the results view `res` joined with `runs`, or
// kAttentionCell: counted by trait in C++), and how it is written. Name,
// source and format sit in one entry, so they cannot drift apart.
struct ResultColumnSpec {
  std::string_view name;
  std::string_view sql;
  CellFormat format;
};
constexpr std::string_view kAttentionCell = "";

constexpr std::array<ResultColumnSpec, 13> kResultColumns{{
    {"run", "res.name", CellFormat::Text},
    {"status", "res.status", CellFormat::Text},
    {"metric", "COALESCE(res.metric_name, '')", CellFormat::Text},
    {"value", "res.main_metric", CellFormat::Significant},
    {"attn_gflops", kAttentionCell, CellFormat::Significant},
    {"total_gflops", "res.total_gflops", CellFormat::Significant},
    {"train_tok_s", "res.train_tokens_per_s", CellFormat::Whole},
    {"eval_tok_s", "res.eval_tokens_per_s", CellFormat::Whole},
    {"params", "res.params", CellFormat::Text},
    {"overhead_%", "100 * res.overhead_fraction", CellFormat::Hundredths},
    // The code that made each run: which commit, and whether the tree was
    // clean when its binary was built (true/false; empty where not recorded).
    {"commit", "runs.git_commit", CellFormat::Text},
    {"clean_tree", "CASE runs.git_dirty WHEN 0 THEN 'true' WHEN 1 THEN 'false' END", CellFormat::Text},
    // The library and kernels that ran its products ("onednn: oneDNN 2.6.3
    // sgemm, ISA avx2"): the speeds of two runs compare only when it matches.
    {"products", "runs.gemm", CellFormat::Text},
}};

// JSON writes a column as a number when its cells are numbers: every
// non-text format, and the integer params and the boolean clean_tree.
constexpr bool is_number(const ResultColumnSpec& c) {
  return c.format != CellFormat::Text || c.name == "params" || c.name == "clean_tree";
}

constexpr bool columns_well_formed() {
  int attention = 0;
  for (size_t i = 0; i < kResultColumns.size(); ++i) {
    const auto& c = kResultColumns[i];
    if (c.name.empty()) return false;
    if (c.sql == kAttentionCell && (++attention > 1 || c.format == CellFormat::Text)) return false;
    for (size_t j = 0; j < i; ++j)
      if (kResultColumns[j].name == c.name) return false;
  }
  return attention == 1;
}
static_assert(columns_well_formed(),
              "results columns: names non-empty and distinct, one attention column, written as a number");

std::string cell(const Statement& q, int col, CellFormat format) {
  if (q.is_null(col)) return "";
  std::ostringstream s;
  switch (format) {
    case CellFormat::Text: return q.text(col);
    case CellFormat::Significant: s << std::setprecision(5) << q.real(col); break;
    case CellFormat::Whole: s << std::fixed << std::setprecision(0) << q.real(col); break;
    case CellFormat::Hundredths: s << std::fixed << std::setprecision(2) << q.real(col); break;
  }
  return s.str();
}

// Forward GFLOPs per sequence of each run's attention-like operators at its
// last FLOP record, by run id; a run with none is absent.
std::map<int64_t, double> attention_gflops(Database& db, bool flagged, const std::set<std::string>& traits) {
  auto q = db.prepare(std::string("SELECT f.run_id, f.operator, ") + (flagged ? "MAX(f.attention)" : "NULL") +
                      ", SUM(f.fwd_executed) / 1e9 FROM flops f "
                      "JOIN (SELECT run_id, MAX(step) AS step FROM flops GROUP BY run_id) last "
                      "ON last.run_id = f.run_id AND last.step = f.step GROUP BY f.run_id, f.operator");
  std::map<int64_t, double> out;
  while (q.step()) {
    const bool attention = q.is_null(2) ? traits.count(q.text(1)) > 0 : q.integer(2) != 0;
    if (attention) out[q.integer(0)] += q.real(3);
  }
  return out;
}

}  // namespace

std::vector<ResultColumn> result_columns() {
  std::vector<ResultColumn> out;
  for (const auto& c : kResultColumns) out.push_back({std::string(c.name), is_number(c)});
  return out;
}

std::vector<ResultRow> read_results(const std::string& db, const std::set<std::string>& attention_operators) {
  Store store(db, StoreAccess::ReadOnly);
  auto flagged = store.db().prepare("SELECT COUNT(*) FROM pragma_table_info('flops') WHERE name = 'attention'");
  const std::map<int64_t, double> attention =
      attention_gflops(store.db(), flagged.step() && flagged.integer(0) > 0, attention_operators);
  std::string select = "SELECT res.id";
  for (const auto& c : kResultColumns) select += ", " + std::string(c.sql == kAttentionCell ? "NULL" : c.sql);
  auto q = store.db().prepare(select +
                              " FROM results res JOIN runs ON runs.id = res.id ORDER BY res.task, res.variant, "
                              "res.seed");
  std::vector<ResultRow> rows;
  while (q.step()) {
    ResultRow row;
    for (size_t i = 0; i < kResultColumns.size(); ++i) {
      const auto& c = kResultColumns[i];
      if (c.sql != kAttentionCell) {
        row.cells.push_back(cell(q, static_cast<int>(i) + 1, c.format));
        continue;
      }
      const auto it = attention.find(q.integer(0));
      std::ostringstream s;
      if (it != attention.end()) s << std::setprecision(5) << it->second;
      row.cells.push_back(s.str());
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace chiar::engine
