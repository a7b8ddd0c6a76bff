#include "summary.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <boost/filesystem.hpp>

#include "engine/sqlite.h"
#include "engine/store.h"
#include "chiar/error.h"
#include "chiar/registry.h"
#include "verdict_stats.h"

namespace chiar::report {

OperatorCatalog::OperatorCatalog(const PluginRegistry& registry) : registry_(&registry) {
  for (const auto& e : registry.entries())
    if (e.kind == "operator") names_.push_back(e.name);
}

OperatorTraits OperatorCatalog::traits(const std::string& name) const {
  if (std::find(names_.begin(), names_.end(), name) != names_.end()) return registry_->operator_traits(name);
  OperatorTraits t;
  t.display_name = name;
  return t;
}

size_t OperatorCatalog::order(const std::string& name) const {
  return static_cast<size_t>(std::find(names_.begin(), names_.end(), name) - names_.begin());
}

Stat stat_of(const std::vector<double>& v) {
  Stat s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= s.n;
  if (s.n < 2) return s;
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(ss / (s.n - 1));
  if (s.n >= 3) s.ci95 = t_quantile_95(s.n - 1) * s.std / std::sqrt(static_cast<double>(s.n));
  return s;
}

bool lower_is_better(const std::string& c) {
  return c == "token_ppl" || c == "word_ppl" || c == "bits_per_byte" || c == "loss" ||
         c.find("gflops") != std::string::npos;
}

namespace {

std::string joined(engine::Database& db, const std::string& column) {
  auto q = db.prepare("SELECT DISTINCT " + column + " FROM runs WHERE " + column + " IS NOT NULL ORDER BY 1");
  std::string out;
  while (q.step()) out += (out.empty() ? "" : "; ") + q.text(0);
  return out;
}

// The distinct non-empty values of `column` in the order runs first had them,
// each with its number of runs when there is more than one: a store filled
// over several sittings says which runs came from which commit.
std::string counted(engine::Database& db, const std::string& column) {
  auto q = db.prepare("SELECT " + column + ", COUNT(*), MIN(COALESCE(started_at, created_at)) FROM runs WHERE " +
                      column + " <> '' GROUP BY 1 ORDER BY 3, 1");
  std::vector<std::pair<std::string, int64_t>> values;
  while (q.step()) values.emplace_back(q.text(0), q.integer(1));
  std::string out;
  for (const auto& [value, runs] : values) {
    out += (out.empty() ? "" : "; ") + value;
    if (values.size() > 1) out += " (" + std::to_string(runs) + (runs == 1 ? " run)" : " runs)");
  }
  return out;
}

void read_valid_curve(engine::Database& db, RunRow& r) {
  auto q = db.prepare(
      "SELECT step, name, value FROM metrics WHERE run_id = ? AND split = 'valid' AND checkpoint = 'current' "
      "AND name IN ('token_ppl', 'accuracy', 'tokens', 'examples') ORDER BY step");
  q.bind(1, r.id);
  std::map<int64_t, std::map<std::string, double>> by_step;
  while (q.step()) by_step[q.integer(0)][q.text(1)] = q.real(2);
  double scored = -1;  // of the first validation
  for (const auto& [step, m] : by_step) {
    const bool lm = m.count("token_ppl") > 0;
    const auto size = m.find(lm ? "tokens" : "examples"), value = m.find(lm ? "token_ppl" : "accuracy");
    if (size == m.end() || value == m.end()) continue;
    if (scored < 0) scored = size->second;
    if (size->second == scored) r.valid_curve[step] = value->second;
  }
}

}  // namespace

Summary summarize(const std::string& file, const OperatorCatalog& operators) {
  // Read-only, refusing a missing file or a database that is not a store.
  engine::Store store(file, engine::StoreAccess::ReadOnly);
  engine::Database& db = store.db();
  Summary s;
  s.db = file;
  s.operators = operators;
  {
    auto q = db.prepare(
        "SELECT id, name, variant, task, seed, status, COALESCE(error, ''), COALESCE(diverged_step, -1), "
        "COALESCE(params, 0), COALESCE(train_tokens_per_s, 0), COALESCE(eval_tokens_per_s, 0), COALESCE(tau, ''), "
        "COALESCE(task_family, ''), COALESCE(step_ms, 0), COALESCE(peak_gpu_allocated_mb, -1), "
        "COALESCE(peak_gpu_reserved_mb, -1), COALESCE(git_commit, ''), COALESCE(git_dirty, 0), COALESCE(gemm, '') "
        "FROM runs ORDER BY id");
    while (q.step()) {
      RunRow r;
      r.id = q.integer(0);
      r.name = q.text(1);
      r.variant = q.text(2);
      r.task = q.text(3);
      r.seed = q.integer(4);
      r.status = engine::run_status_from_string(q.text(5));
      r.error = q.text(6);
      r.diverged_step = q.integer(7);
      r.params = q.integer(8);
      r.train_tps = q.real(9);
      r.eval_tps = q.real(10);
      r.tau = q.text(11);
      r.family = q.text(12);
      r.step_ms = q.real(13);
      r.gpu_allocated_mb = q.real(14);
      r.gpu_reserved_mb = q.real(15);
      r.commit = q.text(16);
      r.dirty = q.integer(17) != 0;
      r.gemm = q.text(18).substr(0, q.text(18).find(':'));  // "onednn: oneDNN 2.6.3 sgemm; ..." -> "onednn"
      s.runs.push_back(r);
    }
  }
  for (auto& r : s.runs) {
    auto m = db.prepare("SELECT checkpoint, name, value FROM metrics WHERE run_id = ? AND split = 'test'");
    m.bind(1, r.id);
    while (m.step()) (m.text(0) == "best" ? r.test_best : r.test_last)[m.text(1)] = m.real(2);
    auto f = db.prepare(
        "SELECT operator, SUM(fwd_executed), SUM(fwd_sparse), SUM(train_executed) FROM flops WHERE run_id = ? AND "
        "step = (SELECT MAX(step) FROM flops WHERE run_id = ?) GROUP BY operator");
    f.bind(1, r.id).bind(2, r.id);
    while (f.step()) {
      if (operators.traits(f.text(0)).attention_flops) r.attn_fwd += f.real(1), r.attn_fwd_sparse += f.real(2);
      r.total_fwd += f.real(1);
      r.total_fwd_sparse += f.real(2);
      r.total_train += f.real(3);
    }
    auto ref = db.prepare("SELECT attention_fwd FROM flops_reference WHERE run_id = ? ORDER BY step DESC LIMIT 1");
    ref.bind(1, r.id);
    if (ref.step()) r.reference_attn_fwd = ref.real(0);
    auto share = db.prepare(
        "SELECT operator, AVG(share) FROM routing WHERE run_id = ? AND "
        "step = (SELECT MAX(step) FROM routing WHERE run_id = ?) GROUP BY operator");
    share.bind(1, r.id).bind(2, r.id);
    while (share.step()) r.final_share[share.text(0)] = share.real(1);
    read_valid_curve(db, r);
  }
  std::set<std::string> seen_variants;
  for (const auto& r : s.runs) {
    if (seen_variants.insert(r.variant).second) s.variant_order.push_back(r.variant);
    if (r.status != engine::RunStatus::Done) s.problems.push_back(&r);
  }
  // One pass over the runs groups them (a sweep has thousands of variants).
  std::vector<std::string> tasks;
  std::map<std::string, std::string> family_of;  // the last family a task's runs name
  std::map<std::pair<std::string, std::string>, std::vector<const RunRow*>> finished;  // by (task, variant)
  for (const auto& r : s.runs) {
    if (!family_of.count(r.task)) tasks.push_back(r.task);
    std::string& family = family_of[r.task];
    if (!r.family.empty()) family = r.family;
    if (r.status == engine::RunStatus::Done) finished[{r.task, r.variant}].push_back(&r);
  }
  for (const auto& task : tasks) {
    TaskSummary t;
    t.task = task;
    t.family = family_of.at(task);
    for (const auto& variant : s.variant_order) {
      VariantSummary v;
      v.variant = variant;
      const auto runs = finished.find({task, variant});
      if (runs == finished.end()) continue;
      v.runs = runs->second;
      std::map<std::string, std::vector<double>> metrics;
      std::vector<double> attn, attn_sp, total, total_sp, ttps, etps, gpu_alloc, gpu_reserved;
      for (const RunRow* r : v.runs) {
        for (const auto& [k, val] : r->test_best) metrics[k].push_back(val);
        attn.push_back(r->attn_fwd / 1e9);
        attn_sp.push_back(r->attn_fwd_sparse / 1e9);
        total.push_back(r->total_fwd / 1e9);
        total_sp.push_back(r->total_fwd_sparse / 1e9);
        ttps.push_back(r->train_tps);
        etps.push_back(r->eval_tps);
        if (r->gpu_allocated_mb >= 0) {
          gpu_alloc.push_back(r->gpu_allocated_mb);
          gpu_reserved.push_back(r->gpu_reserved_mb);
        }
        v.params = r->params;
        if (r->test_best.count("token_ppl")) t.language_model = true;
      }
      for (const auto& [k, vals] : metrics) v.metric[k] = stat_of(vals);
      v.attn_gflops = stat_of(attn);
      v.attn_sparse_gflops = stat_of(attn_sp);
      v.total_gflops = stat_of(total);
      v.total_sparse_gflops = stat_of(total_sp);
      v.train_tps = stat_of(ttps);
      v.eval_tps = stat_of(etps);
      v.gpu_allocated_mb = stat_of(gpu_alloc);
      v.gpu_reserved_mb = stat_of(gpu_reserved);
      t.variants.push_back(std::move(v));
    }
    s.tasks.push_back(std::move(t));
  }
  auto& p = s.provenance;
  p.commits =
      counted(db, "substr(git_commit, 1, 12) || CASE WHEN git_dirty THEN ' with uncommitted changes' ELSE '' END");
  p.torch = joined(db, "torch_version");
  p.blas = joined(db, "blas");
  // `auto` appends the rates it measured in that process (configure_gemm in
  // engine/runtime.cpp), different in every run: the footer names the product
  // library it chose, and the rates stay in each run's gemm column.
  p.gemm = counted(db,
                   "CASE WHEN blas IS NULL THEN NULL WHEN instr(gemm, '; auto: ') > 0 "
                   "THEN substr(gemm, 1, instr(gemm, '; auto: ') - 1) || ' (chosen by auto)' "
                   "ELSE COALESCE(gemm, 'blas (recorded before schema 4)') END");
  p.threads = joined(db, "threads");
  p.hosts = joined(db, "host");
  p.cpus = joined(db, "cpu");
  p.devices = joined(db, "device");
  p.allocators = joined(db, "allocator");
  p.matrices = joined(db, "matrix");
  auto dates = db.prepare("SELECT MIN(started_at), MAX(finished_at) FROM runs");
  if (dates.step()) p.first = dates.text(0), p.last = dates.text(1);
  return s;
}

}  // namespace chiar::report
