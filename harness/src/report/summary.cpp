#include "summary.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <boost/filesystem.hpp>

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

void read_valid_curve(engine::ResultsReader& store, RunRow& r) {
  const auto by_step = store.validation_metrics(r.id, {"token_ppl", "accuracy", "tokens", "examples"});
  double scored = -1;  // of the first validation
  for (const auto& [step, m] : by_step) {
    const bool lm = m.count("token_ppl") > 0;
    const auto size = m.find(lm ? "tokens" : "examples"), value = m.find(lm ? "token_ppl" : "accuracy");
    if (size == m.end() || value == m.end()) continue;
    if (scored < 0) scored = size->second;
    if (size->second == scored) r.valid_curve[step] = value->second;
  }
}

// A run's test metrics, FLOPs, routing shares and validation curve.
void read_records(engine::ResultsReader& store, const OperatorCatalog& operators, RunRow& r) {
  store.test_metrics(r.id, r.test_best, r.test_last);
  for (const auto& f : store.last_flops(r.id)) {
    if (f.counts_as_attention(operators.traits(f.op).attention_flops))
      r.attn_fwd += f.fwd_executed, r.attn_fwd_sparse += f.fwd_sparse;
    r.total_fwd += f.fwd_executed;
    r.total_fwd_sparse += f.fwd_sparse;
    r.total_train += f.train_executed;
  }
  r.reference_attn_fwd = store.reference_attention_fwd(r.id).value_or(0);
  r.final_share = store.last_shares(r.id);
  read_valid_curve(store, r);
}

// One variant's finished runs on one task, summarised: each statistic over
// its seeds.
VariantSummary summarize_variant(const std::string& variant, std::vector<const RunRow*> runs,
                                 const std::string& timing_setup) {
  VariantSummary v;
  v.variant = variant;
  v.runs = std::move(runs);
  const auto timed_here = [&](const RunRow* r) { return r->timing_setup == timing_setup; };
  for (const RunRow* r : v.runs) {
    if (!timed_here(r)) continue;
    if (r->step_ms > 0 && (v.fastest_step_ms == 0 || r->step_ms < v.fastest_step_ms)) v.fastest_step_ms = r->step_ms;
    v.fastest_eval_tps = std::max(v.fastest_eval_tps, r->eval_tps);
  }
  std::map<std::string, std::vector<double>> metrics;
  std::vector<double> attn, attn_sp, total, total_sp, ttps, etps, step_ms, gpu_alloc, gpu_reserved;
  for (const RunRow* r : v.runs) {
    for (const auto& [k, val] : r->test_best) metrics[k].push_back(val);
    attn.push_back(r->attn_fwd / 1e9);
    attn_sp.push_back(r->attn_fwd_sparse / 1e9);
    total.push_back(r->total_fwd / 1e9);
    total_sp.push_back(r->total_fwd_sparse / 1e9);
    if (!timed_here(r)) {
      v.other_setup.push_back(r);
    } else {
      if (v.fastest_step_ms > 0 && r->step_ms > kDisturbedStepRatio * v.fastest_step_ms) {
        v.disturbed.push_back(r);
      } else {
        ttps.push_back(r->train_tps);
        if (r->step_ms > 0) step_ms.push_back(r->step_ms);
      }
      if (r->eval_tps * kDisturbedStepRatio < v.fastest_eval_tps)
        v.disturbed_eval.push_back(r);
      else
        etps.push_back(r->eval_tps);
    }
    if (r->gpu_allocated_mb >= 0) {
      gpu_alloc.push_back(r->gpu_allocated_mb);
      gpu_reserved.push_back(r->gpu_reserved_mb);
    }
    v.params = r->params;
  }
  for (const auto& [k, vals] : metrics) v.metric[k] = stat_of(vals);
  v.attn_gflops = stat_of(attn);
  v.attn_sparse_gflops = stat_of(attn_sp);
  v.total_gflops = stat_of(total);
  v.total_sparse_gflops = stat_of(total_sp);
  v.train_tps = stat_of(ttps);
  v.eval_tps = stat_of(etps);
  if (!step_ms.empty()) {
    std::sort(step_ms.begin(), step_ms.end());
    const size_t mid = step_ms.size() / 2;
    v.step_ms = step_ms.size() % 2 ? step_ms[mid] : (step_ms[mid - 1] + step_ms[mid]) / 2;
  }
  v.gpu_allocated_mb = stat_of(gpu_alloc);
  v.gpu_reserved_mb = stat_of(gpu_reserved);
  return v;
}

// The hardware most finished runs were timed on, and how many that is.
void choose_timing_setup(Summary& s) {
  std::map<std::string, int64_t> runs_on;  // setup -> finished runs
  std::vector<std::string> order;          // setups in run order
  for (const auto& r : s.runs) {
    if (r.status != engine::RunStatus::Done) continue;
    if (runs_on[r.timing_setup]++ == 0) order.push_back(r.timing_setup);
  }
  for (const auto& setup : order)
    if (runs_on[setup] > s.runs_on_timing_setup) {
      s.timing_setup = setup;
      s.runs_on_timing_setup = runs_on[setup];
    }
}

// The tasks in the order runs first name them, each with its variants in
// s.variant_order. One pass over the runs groups them (a sweep has
// thousands of variants).
std::vector<TaskSummary> summarize_tasks(const Summary& s) {
  std::vector<std::string> tasks;
  std::map<std::string, std::string> family_of;  // the last family a task's runs name
  std::map<std::pair<std::string, std::string>, std::vector<const RunRow*>> finished;  // by (task, variant)
  for (const auto& r : s.runs) {
    if (!family_of.count(r.task)) tasks.push_back(r.task);
    std::string& family = family_of[r.task];
    if (!r.family.empty()) family = r.family;
    if (r.status == engine::RunStatus::Done) finished[{r.task, r.variant}].push_back(&r);
  }
  std::vector<TaskSummary> out;
  for (const auto& task : tasks) {
    TaskSummary t;
    t.task = task;
    t.family = family_of.at(task);
    for (const auto& variant : s.variant_order) {
      const auto runs = finished.find({task, variant});
      if (runs == finished.end()) continue;
      t.variants.push_back(summarize_variant(variant, runs->second, s.timing_setup));
      for (const RunRow* r : runs->second)
        if (r->test_best.count("token_ppl")) t.language_model = true;
    }
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

Summary summarize(const std::string& file, const OperatorCatalog& operators) {
  // Read-only, refusing a missing file or a database that is not a store.
  engine::ResultsReader store(file);
  Summary s;
  s.db = file;
  s.operators = operators;
  for (auto& stored : store.runs()) {
    RunRow r;
    static_cast<engine::StoredRun&>(r) = std::move(stored);
    read_records(store, operators, r);
    s.runs.push_back(std::move(r));
  }
  std::set<std::string> seen_variants;
  for (const auto& r : s.runs) {
    if (seen_variants.insert(r.variant).second) s.variant_order.push_back(r.variant);
    if (r.status != engine::RunStatus::Done) s.problems.push_back(&r);
  }
  choose_timing_setup(s);
  s.tasks = summarize_tasks(s);
  s.provenance = store.provenance();
  return s;
}

}  // namespace chiar::report
