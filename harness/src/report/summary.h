#pragma once
// What a report shows, read from a results store only.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "chiar/operator.h"
#include "engine/store/results.h"

namespace chiar {
class PluginRegistry;
}

namespace chiar::report {

// How reports present the operators a store names: each one's traits from
// the plugin registry (asked when first needed, so a plugin the store never
// names is never built), and its place among the registry's operators. An
// operator the registry lacks (its plugin is not loaded) gets the default
// traits under its stored name and comes after every registered one.
class OperatorCatalog {
 public:
  OperatorCatalog() = default;                               // no registry: the defaults for every operator
  explicit OperatorCatalog(const PluginRegistry& registry);  // the registry must outlive it
  OperatorTraits traits(const std::string& name) const;
  // Position in registry order (kind, then name); unknown names after all.
  size_t order(const std::string& name) const;

 private:
  const PluginRegistry* registry_ = nullptr;
  std::vector<std::string> names_;  // the registry's operators, in its order
};

// Mean, sample standard deviation and the half-width of a 95% confidence
// interval (Student's t; only for n >= 3, else 0).
struct Stat {
  int n = 0;
  double mean = 0, std = 0, ci95 = 0;
};
Stat stat_of(const std::vector<double>& values);

// A run as the store holds it, and what the report derives from its records.
struct RunRow : engine::StoredRun {
  std::map<std::string, double> test_best, test_last;  // metric -> value
  // Per sequence; attention: the operators whose traits count attention FLOPs.
  double attn_fwd = 0, attn_fwd_sparse = 0, total_fwd = 0, total_fwd_sparse = 0;
  double reference_attn_fwd = 0;
  double total_train = 0;                     // forward + backward FLOPs of a training step, per sequence, executed
  std::map<std::string, double> final_share;  // operator -> mean share over routed layers
  // The task's quality metric (token_ppl or accuracy) at each validation that
  // scored as many tokens or examples as the first one: intermediate
  // validations may score part of the split and the last one all of it, and
  // a curve mixes only like with like. Step -> value.
  std::map<int64_t, double> valid_curve;
};

// A finished run's speed was taken under other load when its median step
// time is over this many times the fastest one's among its variant's runs on
// the task (or its evaluation tokens/s under the fastest's divided by it: the
// test scoring is timed apart from training). Those runs do the same work
// per step (routing moves a few percent of it), so their speeds differ by
// what else the machine ran: in the reproduction's store
// (results/repro.db), by up to about 1.5x between runs nothing was known to
// disturb, and by 3.4-7.8x for the three that trained beside another job.
constexpr double kDisturbedStepRatio = 2.0;

struct VariantSummary {
  std::string variant;
  std::vector<const RunRow*> runs;     // finished ("done") runs
  std::map<std::string, Stat> metric;  // test, best checkpoint: every finished run
  Stat attn_gflops, attn_sparse_gflops, total_gflops, total_sparse_gflops;
  // Speeds come from the runs timed on the store's timing setup alone
  // (Summary::timing_setup; the others are other_setup), and of those leave
  // out the runs timed under other load (kDisturbedStepRatio), training and
  // evaluation each by its own timing. Every run's metrics count.
  std::vector<const RunRow*> other_setup, disturbed, disturbed_eval;
  Stat train_tps, eval_tps;
  double step_ms = 0;          // median of the undisturbed runs' median step times; 0: none recorded one
  double fastest_step_ms = 0;  // the shortest of its runs' median step times on the timing setup
  double fastest_eval_tps = 0;
  Stat gpu_allocated_mb, gpu_reserved_mb;  // over the runs that trained on a GPU (n = 0: none did)
  int64_t params = 0;
};

struct TaskSummary {
  std::string task;
  std::string family;  // of its runs ("" when none set one)
  bool language_model = false;
  std::vector<VariantSummary> variants;  // in the order variants first appear
};

using Provenance = engine::StoreProvenance;

struct Summary {
  std::string db;
  std::vector<RunRow> runs;
  std::vector<TaskSummary> tasks;
  std::vector<const RunRow*> problems;  // failed, diverged, interrupted, never finished
  // The hardware that timed the most finished runs (the first such in run
  // order on a tie): speeds, speed-ups and the equal-time clock come from its
  // runs alone, since a store filled over several sittings may span machines
  // whose speeds differ by more than any variant does. "" when no run recorded
  // one (then every run's speed counts).
  std::string timing_setup;
  int64_t runs_on_timing_setup = 0;  // of provenance.finished_runs
  Provenance provenance;
  std::vector<std::string> variant_order;  // fixes colours across charts
  OperatorCatalog operators;
};

Summary summarize(const std::string& db, const OperatorCatalog& operators);

// Lower is better for perplexities, bits per byte and FLOPs; higher for accuracy and speed.
bool lower_is_better(const std::string& column);

}  // namespace chiar::report
