#include "claims.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

namespace chiar::report {
namespace {

constexpr const char* kBaseline = "$baseline";
constexpr double kAlpha = 0.05;  // the family-wise error rate of a report's verdicts
// A share of exactly 0 or 1 has no logit; seeds are held this far inside.
constexpr double kShareFloor = 1e-4;

OperatorRole role_of(const std::string& name) {
  if (name == "cheap_mixing") return OperatorRole::CheapMixing;
  if (name == "global_mixing") return OperatorRole::GlobalMixing;
  return OperatorRole::IntermediateMixing;
}

const VariantSummary* find(const Summary& s, const std::string& task, const std::string& variant) {
  for (const auto& t : s.tasks)
    if (t.task == task)
      for (const auto& v : t.variants)
        if (v.variant == variant) return &v;
  return nullptr;
}

std::string fmt(const char* f, double a, double b = 0, double c = 0) {
  char buf[256];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

// value with `decimals` digits after the point, signed when asked.
std::string fixed_point(double value, int decimals, bool sign = false) {
  char buf[64];
  std::snprintf(buf, sizeof buf, sign ? "%+.*f" : "%.*f", decimals, value);
  return buf;
}

bool is_percent(const MetricInfo& m) { return m.scale == 100; }

std::string shown(const MetricInfo& m, double value) {
  return fixed_point(value * m.scale, m.decimals) + (is_percent(m) ? "%" : "");
}

// A difference in the metric's shown units, to its decimals: percentage
// points for a percentage.
std::string shown_difference(const MetricInfo& m, double value) {
  return fixed_point(value * m.scale, m.decimals, /*sign=*/true) + (is_percent(m) ? " pp" : "");
}

bool is_pattern(const std::string& task) { return task.find_first_of("*?[") != std::string::npos; }

bool matches(const std::string& pattern, const std::string& task) {
  return fnmatch(pattern.c_str(), task.c_str(), 0) == 0;
}

// How the report names a task a claim is about: with the family it stands
// for, so that a CPU-scale corpus standing in for the paper's says so.
std::string task_label(const ClaimSpec& c, const std::string& task) {
  return c.family.empty() ? task : task + " (family: " + c.family + ")";
}

// What a claim about no task of the store lacks.
std::string needs(const ClaimSpec& c, const std::string& variants) {
  if (!c.family.empty()) return "needs " + variants + " on a task of family '" + c.family + "'";
  return "needs " + variants + (is_pattern(c.task) ? " on a task matching '" + c.task + "'" : " on task " + c.task);
}

// A variant's test metric per seed (the best-validation checkpoint), for
// the finished runs that report it.
std::map<int64_t, double> per_seed(const VariantSummary* v, const std::string& metric) {
  std::map<int64_t, double> out;
  if (!v) return out;
  for (const RunRow* r : v->runs) {
    if (metric == "attention_gflops")
      out[r->seed] = r->attn_fwd / 1e9;
    else if (metric == "total_gflops")
      out[r->seed] = r->total_fwd / 1e9;
    else if (const auto it = r->test_best.find(metric); it != r->test_best.end())
      out[r->seed] = it->second;
  }
  return out;
}

std::vector<double> values(const std::map<int64_t, double>& by_seed) {
  std::vector<double> out;
  for (const auto& [seed, value] : by_seed) out.push_back(value);
  return out;
}

double mean(const std::vector<double>& v) { return v.empty() ? NAN : stat_of(v).mean; }

// The runs of a variant on a task that give it no value (diverged, failed or
// unfinished), e.g. "chiar_soft 2 diverged, 1 unfinished"; "" for none. Only
// finished runs are compared, so a variant judged on its survivors says so.
std::string left_out(const Summary& s, const std::string& task, const std::string& variant) {
  int diverged = 0, failed = 0, unfinished = 0;
  for (const RunRow* r : s.problems) {  // every run not done
    if (r->task != task || r->variant != variant) continue;
    if (r->status == engine::RunStatus::Diverged)
      ++diverged;
    else if (r->status == engine::RunStatus::Failed)
      ++failed;
    else
      ++unfinished;
  }
  std::string out;
  const auto add = [&](int n, const char* what) {
    if (n > 0) out += (out.empty() ? variant + " " : ", ") + std::to_string(n) + " " + what;
  };
  add(diverged, "diverged");
  add(failed, "failed");
  add(unfinished, "unfinished");
  return out;
}

// Both sides' values over the seeds both finished, aligned by seed.
std::pair<std::vector<double>, std::vector<double>> shared_seeds(const std::map<int64_t, double>& x,
                                                                 const std::map<int64_t, double>& y) {
  std::pair<std::vector<double>, std::vector<double>> out;
  for (const auto& [seed, value] : x)
    if (const auto it = y.find(seed); it != y.end()) {
      out.first.push_back(value);
      out.second.push_back(it->second);
    }
  return out;
}

// How the report names the code that made a run.
std::string code_state(const RunRow& r) {
  std::string out = r.commit.empty() ? std::string("an unknown commit") : r.commit.substr(0, 12);
  if (r.dirty) out += " with uncommitted changes";
  if (!r.gemm.empty()) out += ", products on " + r.gemm;
  return out;
}

// The code states behind the seeds a row uses on each side; "" when they
// are one clean state.
std::string mixed_code_of(const std::vector<std::pair<const VariantSummary*, std::set<int64_t>>>& sides) {
  std::map<std::string, int> runs;  // state -> runs
  bool dirty = false;
  for (const auto& [v, seeds] : sides) {
    if (!v) continue;
    for (const RunRow* r : v->runs)
      if (seeds.count(r->seed)) {
        ++runs[code_state(*r)];
        dirty |= r->dirty;
      }
  }
  if (runs.size() <= 1 && !dirty) return "";
  std::string out = std::to_string(runs.size()) + (runs.size() == 1 ? " code state: " : " code states: ");
  bool first = true;
  for (const auto& [state, n] : runs) {
    out += (first ? "" : "; ") + state + " (" + std::to_string(n) + (n == 1 ? " run)" : " runs)");
    first = false;
  }
  return out;
}

template <class Map>
std::set<int64_t> keys(const Map& m) {
  std::set<int64_t> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

// Which of the claim's metrics a task is compared on: the first one a
// finished run of either variant reports there (the first of the list when
// none does, so that the missing runs are named in the claim's terms).
size_t metric_on(const ClaimSpec& c, const VariantSummary* x, const VariantSummary* y) {
  for (size_t i = 0; i < c.metrics.size(); ++i)
    if (!per_seed(x, c.metrics[i]).empty() || !per_seed(y, c.metrics[i]).empty()) return i;
  return 0;
}

// The part of a row every kind shares: which task, which variants, what
// was left out, and what keeps a test from running.
TaskTest base_row(const ClaimSpec& c, const Summary& s, const TaskSummary& t, const std::string& a,
                  const std::string& b, size_t metric) {
  TaskTest row;
  row.task = t.task;
  row.label = task_label(c, t.task);
  row.metric = c.metrics[metric];
  row.lower_better = c.better[metric] == "lower";
  row.a = a;
  row.b = b;
  for (const std::string& side : {a, b})
    if (!side.empty())
      if (const std::string lost = left_out(s, t.task, side); !lost.empty())
        row.left_out += (row.left_out.empty() ? "" : "; ") + lost;
  return row;
}

// Fills the row's seeds and means per side, names a variant without a
// finished run, and says whether both sides have the seeds a test needs.
bool count_sides(TaskTest& row, const std::map<int64_t, double>& x, const std::map<int64_t, double>& y) {
  row.n_a = static_cast<int>(x.size());
  row.n_b = static_cast<int>(y.size());
  row.mean_a = mean(values(x));
  row.mean_b = mean(values(y));
  if (x.empty() && y.empty())
    row.missing = row.a + " and " + row.b + " have no finished run";
  else if (x.empty() || y.empty())
    row.missing = (x.empty() ? row.a : row.b) + " has no finished run";
  return row.n_a >= kMinSeedsPerSide && row.n_b >= kMinSeedsPerSide;
}

// "a beats b" on one task: the per-seed difference, paired by seed over the
// seeds both finished when there are enough, else Welch's t.
// Keeps the values of the `limit` smallest seeds either side has (0: all):
// the seeds a sequential design's look was taken on.
void keep_first_seeds(std::map<int64_t, double>& x, std::map<int64_t, double>& y, int limit) {
  if (limit <= 0) return;
  std::set<int64_t> seeds;
  for (const auto* side : {&x, &y})
    for (const auto& [seed, value] : *side) seeds.insert(seed);
  if (static_cast<int>(seeds.size()) <= limit) return;
  const int64_t last = *std::next(seeds.begin(), limit - 1);
  for (auto* side : {&x, &y})
    for (auto it = side->begin(); it != side->end();) it = it->first > last ? side->erase(it) : std::next(it);
}

TaskTest compare_on(const ClaimSpec& c, const Summary& s, const TaskSummary& t, const std::string& a,
                    const std::string& b, int seed_limit) {
  const VariantSummary* w = find(s, t.task, a);
  const VariantSummary* l = find(s, t.task, b);
  TaskTest row = base_row(c, s, t, a, b, metric_on(c, w, l));
  auto x = per_seed(w, row.metric), y = per_seed(l, row.metric);
  keep_first_seeds(x, y, seed_limit);
  row.mixed_code = mixed_code_of({{w, keys(x)}, {l, keys(y)}});
  if (!count_sides(row, x, y)) return row;
  // A seed fixes both variants' initialisation and data order, so what the
  // seed alone explains cancels in the paired test; a seed one variant lost
  // (diverged, failed) leaves the other's run out too.
  const auto [shared_x, shared_y] = shared_seeds(x, y);
  row.test = static_cast<int>(shared_x.size()) >= kMinSeedsPerSide ? paired_difference(shared_x, shared_y)
                                                                   : welch_difference(values(x), values(y));
  row.estimate = row.test->diff;
  const auto all_positive = [](const std::vector<double>& v) {
    return std::all_of(v.begin(), v.end(), [](double x) { return x > 0; });
  };
  if (std::isfinite(c.effect_ratio) && all_positive(values(x)) && all_positive(values(y))) {
    const auto logs = [](std::vector<double> v) {
      for (double& e : v) e = std::log(e);
      return v;
    };
    row.log_ratio = row.test->paired ? paired_difference(logs(shared_x), logs(shared_y))
                                     : welch_difference(logs(values(x)), logs(values(y)));
  }
  return row;
}

// The cut a variant's metric makes against another's on one task, per seed
// over the seeds both finished: 100 (1 - a / b), in percent.
TaskTest reduction_on(const ClaimSpec& c, const Summary& s, const TaskSummary& t, const std::string& a,
                      const std::string& b) {
  TaskTest row = base_row(c, s, t, a, b, 0);
  const VariantSummary* w = find(s, t.task, a);
  const VariantSummary* l = find(s, t.task, b);
  const auto x = per_seed(w, row.metric), y = per_seed(l, row.metric);
  row.mixed_code = mixed_code_of({{w, keys(x)}, {l, keys(y)}});
  if (!count_sides(row, x, y)) return row;
  const auto [shared_x, shared_y] = shared_seeds(x, y);
  std::vector<double> cuts;
  for (size_t i = 0; i < shared_x.size(); ++i)
    cuts.push_back(shared_y[i] > 0 ? 100.0 * (1.0 - shared_x[i] / shared_y[i]) : NAN);
  if (static_cast<int>(cuts.size()) < kMinSeedsPerSide) {
    row.missing = fmt("a cut needs %.0f seeds both variants finished, found %.0f", kMinSeedsPerSide,
                      static_cast<double>(cuts.size()));
    return row;
  }
  row.test = one_sample(cuts, 0.0);
  row.estimate = row.test->diff;
  return row;
}

double logit(double p) {
  const double q = std::clamp(p, kShareFloor, 1 - kShareFloor);
  return std::log(q / (1 - q));
}

double expit(double x) { return 1 / (1 + std::exp(-x)); }

// The final routing share the variant's finished runs give the claim's
// operator (or role) on one task, tested on the logit scale against the
// threshold's logit, so that its interval stays inside (0, 1).
TaskTest share_on(const ClaimSpec& c, const Summary& s, const TaskSummary& t, const std::string& a) {
  TaskTest row = base_row(c, s, t, a, "", 0);
  std::vector<double> shares;
  for (const auto& r : s.runs) {
    if (r.variant != a || r.task != t.task || r.status != engine::RunStatus::Done) continue;
    double share = 0;
    bool any = false;
    for (const auto& [op, value] : r.final_share) {
      const bool counted = c.op.empty() ? s.operators.traits(op).role == role_of(c.role) : op == c.op;
      if (!counted) continue;
      share += value;
      any = true;
    }
    if (any) shares.push_back(share);
  }
  row.n_a = static_cast<int>(shares.size());
  row.mean_a = mean(shares);
  std::set<int64_t> used;
  for (const auto& r : s.runs)
    if (r.variant == a && r.task == t.task && r.status == engine::RunStatus::Done && !r.final_share.empty())
      used.insert(r.seed);
  row.mixed_code = mixed_code_of({{find(s, t.task, a), used}});
  if (shares.empty()) row.missing = a + " has no finished run with routing records";
  if (row.n_a < kMinSeedsPerSide) return row;
  std::vector<double> logits;
  for (double v : shares) logits.push_back(logit(v));
  row.test = one_sample(logits, logit(c.threshold));
  row.estimate = expit(row.test->diff + logit(c.threshold));
  return row;
}

}  // namespace

// ---- Verdicts: every interval at the table's simultaneous level ----------

namespace {

namespace v = verdict;

// Whether a row's test enters the family of tests: it has a spread to
// measure against. A row whose seeds all agree has an exact value instead.
bool tested(const TaskTest& r) { return r.test && std::isfinite(r.test->diff) && r.test->se > 0; }

std::string p_text(double p) { return p < 0.001 ? "p < 0.001" : fmt("p = %.3f", p); }

// The sign the paper gives a - b: from its stated effect, else from its two
// values; 0 when it states neither.
int paper_sign(const ClaimSpec& c) {
  const auto sign = [](double x) { return (x > 0) - (x < 0); };
  if (std::isfinite(c.effect)) return sign(c.effect);
  if (std::isfinite(c.effect_ratio)) return sign(c.effect_ratio - 1);
  if (c.paper.size() == 2) return sign(c.paper[0] - c.paper[1]);
  return 0;
}

// "compatible with the paper's +35.50 pp", or "rules out the paper's
// +35.50 pp: at most +1.26 pp": where the paper's effect lies against our
// simultaneous interval.
std::string against_paper_effect(const TaskTest& row, const ClaimSpec& c) {
  const MetricInfo& m = *metric_info(row.metric);
  if (std::isfinite(c.effect)) {
    const double e = c.effect / m.scale;
    const std::string theirs = "the paper's " + shown_difference(m, e);
    if (e > row.hi) return "rules out " + theirs + ": at most " + shown_difference(m, row.hi);
    if (e < row.lo) return "rules out " + theirs + ": at least " + shown_difference(m, row.lo);
    return "compatible with " + theirs;
  }
  if (!std::isfinite(c.effect_ratio)) return "";
  if (!row.log_ratio || !(row.log_ratio->se > 0))
    return fmt("the paper's ratio %.4g not tested (a value not above 0, or no spread)", c.effect_ratio);
  const Interval at = interval_at(*row.log_ratio, row.confidence);
  const double lo = std::exp(at.lo), hi = std::exp(at.hi);
  const std::string ours = fmt("ratio %.3f [%.3f, %.3f]", std::exp(row.log_ratio->diff), lo, hi);
  if (c.effect_ratio > hi || c.effect_ratio < lo) return ours + fmt(" rules out the paper's %.4g", c.effect_ratio);
  return ours + fmt(", compatible with the paper's %.4g", c.effect_ratio);
}

// A margin (in shown units) at the metric's decimals, or with as many more
// as it takes to be within 1% of itself: 0.005 perplexity is not "0.01".
std::string margin_text(const MetricInfo& m, double margin) {
  int decimals = m.decimals;
  const auto rounded = [&](int n) { return std::round(margin * std::pow(10.0, n)) / std::pow(10.0, n); };
  while (decimals < 12 && std::abs(rounded(decimals) - margin) > 0.01 * margin) ++decimals;
  return fixed_point(margin, decimals) + (is_percent(m) ? " pp" : "");
}

// Two one-sided tests at the table's level: is the difference inside
// (-margin, +margin)?
std::string equivalence_of(TaskTest& row, const ClaimSpec& c, const ClaimsTable& table) {
  if (!std::isfinite(c.margin)) return "";
  const MetricInfo& m = *metric_info(row.metric);
  row.equivalence_p = std::min(1.0, tost_p(*row.test, c.margin / m.scale) * table.tests);
  const std::string band = "within ±" + margin_text(m, c.margin);
  const std::string how = " (two one-sided tests, adjusted " + p_text(row.equivalence_p) + ")";
  return (row.equivalence_p < kAlpha ? "equivalent " : "not shown equivalent ") + band + how;
}

// A row a sequential design looked at: decided where p is below its
// latest look's boundary, its interval the repeated one at that level.
void decide_sequential(TaskTest& row, const ClaimSpec& c, const SequentialLookState& look, int rounds) {
  const Difference& d = *row.test;
  row.confidence = 1 - look.nominal;
  const Interval at = interval_at(d, row.confidence);
  row.lo = at.lo;
  row.hi = at.hi;
  row.boundary = look.nominal;
  const int sign = paper_sign(c);
  const bool above = at.lo > 0, below = at.hi < 0;
  if (above || below) {
    row.verdict = below == row.lower_better ? verdict::kHolds : verdict::kDoesNotHold;
    if (sign) row.direction = (above ? 1 : -1) == sign ? "agrees" : "contradicts";
  } else {
    row.verdict = verdict::kInconclusive;
  }
  const std::string round = "round " + std::to_string(look.round + 1) + " of " + std::to_string(rounds);
  if (look.outcome == "futile")
    row.note = "seeds stopped for futility at " + round;
  else if (look.outcome == "final")
    row.note = "undecided after the last round";
  else if (look.outcome == "continue")
    row.note = "the design is not finished: last look at " + round;
  else
    row.note = "decided at " + round;
  const int now = d.paired ? d.n_a : std::min(d.n_a, d.n_b);
  if (now != look.seeds)
    row.note += "; its look had " + std::to_string(look.seeds) + " seeds, the store has " + std::to_string(now) +
                " now, tested at the look's boundary";
}

// Decides a row that has no test (not enough seeds) or a NaN estimate (no
// verdict, with `nan_note`); otherwise keeps its raw interval and says it
// is to be tested.
bool testable(TaskTest& row, const char* nan_note) {
  if (!row.test) {
    row.verdict = v::kNotEnoughSeeds;
    return false;
  }
  row.raw_lo = row.test->lo;
  row.raw_hi = row.test->hi;
  if (std::isfinite(row.test->diff)) return true;
  row.verdict = v::kNoVerdict;
  row.note = nan_note;
  return false;
}

// A difference every seed gives alike has no spread to test it against: the
// row is inconclusive, and says why.
bool undecided_without_spread(TaskTest& row) {
  const Difference& d = *row.test;
  if (d.se > 0) return false;
  row.no_spread = true;
  row.lo = row.hi = d.diff;
  row.verdict = v::kInconclusive;
  row.note =
      "identical across seeds: every seed gives the same difference, so there is no spread to test it "
      "against and no p-value";
  return true;
}

// The row's interval at the table's simultaneous level.
Interval simultaneous_interval(TaskTest& row, const ClaimsTable& table) {
  row.confidence = table.confidence;
  const Interval at = interval_at(*row.test, table.confidence);
  row.lo = at.lo;
  row.hi = at.hi;
  return at;
}

void decide_compare(TaskTest& row, const ClaimSpec& c, const ClaimsTable& table,
                    const SequentialLookState* look = nullptr, int rounds = 0) {
  if (!testable(row, "a metric is NaN")) return;
  const Difference& d = *row.test;
  const int sign = paper_sign(c);
  if (sign) row.direction = "undecided";
  if (undecided_without_spread(row)) return;
  if (look) {
    decide_sequential(row, c, *look, rounds);
    row.paper_effect = against_paper_effect(row, c);
    if (std::isfinite(c.margin)) row.equivalence = "equivalence not tested on a row a sequential design decides";
    return;
  }
  const Interval at = simultaneous_interval(row, table);
  // Bonferroni: p m < alpha exactly when the interval at 1 - alpha / m
  // excludes zero, so the p-value and the interval never disagree.
  row.p_adjusted = std::min(1.0, d.p * table.tests);
  const bool above = at.lo > 0, below = at.hi < 0;
  if (above || below) {
    row.verdict = below == row.lower_better ? v::kHolds : v::kDoesNotHold;
    if (sign) row.direction = (above ? 1 : -1) == sign ? "agrees" : "contradicts";
  } else {
    row.verdict = v::kInconclusive;
  }
  row.paper_effect = against_paper_effect(row, c);
  row.equivalence = equivalence_of(row, c, table);
}

// "a and b differ by less than the margin": holds where two one-sided tests
// at the table's level put the difference inside it, does not hold where
// the simultaneous interval lies wholly outside it, and is open otherwise.
void decide_equivalent(TaskTest& row, const ClaimSpec& c, const ClaimsTable& table) {
  if (!testable(row, "a metric is NaN") || undecided_without_spread(row)) return;
  const Interval at = simultaneous_interval(row, table);
  // No adjusted p against zero: the verdict is the two one-sided tests',
  // and their p is the one the row shows.
  row.equivalence = equivalence_of(row, c, table);
  const double margin = c.margin / metric_info(row.metric)->scale;
  if (row.equivalence_p < kAlpha)
    row.verdict = v::kHolds;
  else if (at.lo > margin || at.hi < -margin)
    row.verdict = v::kDoesNotHold;
  else
    row.verdict = v::kInconclusive;
}

// The executed cut of attention FLOPs against the analytic one (what a
// sparse execution of the routed share needs), and which explains a miss.
std::string explain_attention_cut(const Summary& s, const ClaimSpec& c, const TaskTest& row) {
  const VariantSummary* x = find(s, row.task, row.a);
  const VariantSummary* y = find(s, row.task, row.b);
  if (row.metric != "attention_gflops" || !x || !y) return "";
  std::vector<double> sparse_x, sparse_y, share;
  for (const RunRow* r : x->runs) {
    sparse_x.push_back(r->attn_fwd_sparse);
    double routed = 0;
    for (const auto& [op, value] : r->final_share)
      if (s.operators.traits(op).attention_flops) routed += value;
    if (!r->final_share.empty()) share.push_back(routed);
  }
  for (const RunRow* r : y->runs) sparse_y.push_back(r->attn_fwd_sparse);
  const double sy = mean(sparse_y);
  if (!(sy > 0)) return "";
  const double sparse = 100.0 * (1.0 - mean(sparse_x) / sy);
  std::string out = fmt("; %.1f%% for a sparse execution", -sparse);
  if (!share.empty()) out += fmt(" of the %.1f%% of routed-layer tokens attention got", 100 * mean(share));
  const double gap_to_claim = std::abs(row.estimate - c.reduction);
  if (gap_to_claim <= c.tolerance) return out;
  if (std::abs(sparse - c.reduction) <= c.tolerance)
    return out + fmt("; the %.1f points to the claim are attention computed densely for every position "
                     "(dense routed execution)",
                     gap_to_claim);
  return out + fmt("; the claim's %.1f%% needs a different routed share: the share drifted from the one "
                   "the claim assumes",
                   c.reduction);
}

void decide_reduction(TaskTest& row, const ClaimSpec& c, const ClaimsTable& table) {
  if (!testable(row, "a metric is NaN, or the second variant's is 0")) return;
  const Difference& d = *row.test;
  const double low = c.reduction - c.tolerance, high = c.reduction + c.tolerance;
  row.confidence = table.confidence;
  if (!(d.se > 0)) {
    row.no_spread = true;
    row.lo = row.hi = d.diff;
    if (metric_info(row.metric)->exact) {
      // A FLOP count is the same on every seed by construction: the cut is
      // exact, and it is inside the band or not.
      row.verdict = d.diff >= low && d.diff <= high ? v::kHolds : v::kDoesNotHold;
    } else {
      row.verdict = v::kInconclusive;
      row.note = "identical across seeds: there is no spread to test the cut against";
    }
    return;
  }
  const Interval at = interval_at(d, table.confidence);
  row.lo = at.lo;
  row.hi = at.hi;
  if (at.lo >= low && at.hi <= high)
    row.verdict = v::kHolds;
  else if (at.hi < low || at.lo > high)
    row.verdict = v::kDoesNotHold;
  else
    row.verdict = v::kInconclusive;
}

void decide_share(TaskTest& row, const ClaimSpec& c, const ClaimsTable& table) {
  if (!row.test) {
    row.verdict = v::kNotEnoughSeeds;
    return;
  }
  const Difference& d = *row.test;  // on the logit scale, against the threshold's logit
  const double shift = logit(c.threshold);
  row.raw_lo = expit(d.lo + shift);
  row.raw_hi = expit(d.hi + shift);
  if (!(d.se > 0)) {
    row.no_spread = true;
    row.lo = row.hi = row.estimate;
    row.verdict = v::kInconclusive;
    row.note = "identical across seeds: there is no spread to test the share against";
    return;
  }
  row.confidence = table.confidence;
  const Interval at = interval_at(d, table.confidence);
  row.lo = expit(at.lo + shift);
  row.hi = expit(at.hi + shift);
  const bool lower = c.better.front() == "lower";
  if (lower ? row.hi < c.threshold : row.lo > c.threshold)
    row.verdict = v::kHolds;
  else if (lower ? row.lo > c.threshold : row.hi < c.threshold)
    row.verdict = v::kDoesNotHold;
  else
    row.verdict = v::kInconclusive;
}

// ---- What each row says ---------------------------------------------------

std::string seeds_text(const TaskTest& row, bool two_sides) {
  std::string out = two_sides ? fmt("%.0f and %.0f seeds", row.n_a, row.n_b) : fmt("%.0f runs", row.n_a);
  if (!row.left_out.empty()) out += "; left out: " + row.left_out;
  if (!row.missing.empty()) return out + "; " + row.missing;
  if (!row.test) out += fmt("; a verdict needs %.0f per side", kMinSeedsPerSide);
  return out;
}

std::string interval_text(const TaskTest& row, const MetricInfo& m) {
  if (row.no_spread) return ", identical across seeds";
  return " [" + shown_difference(m, row.lo) + ", " + shown_difference(m, row.hi) + "]";
}

// e.g. "chiar_dct_attn 32.00 vs baseline 62.00 (3 and 3 seeds); difference
// -30.00 [-31.20, -28.80], paired by seed, p = 0.002, d_z = -12.10".
std::string describe_compare(const TaskTest& row) {
  const MetricInfo& m = *metric_info(row.metric);
  const auto side = [&](const std::string& name, double value, int n) {
    return name + (n > 0 ? " " + shown(m, value) : "");
  };
  std::string out =
      side(row.a, row.mean_a, row.n_a) + " vs " + side(row.b, row.mean_b, row.n_b) + " (" + seeds_text(row, true) + ")";
  if (!row.test || !std::isfinite(row.test->diff)) return out;  // NaN: nothing to state
  const Difference& d = *row.test;
  out += "; difference " + shown_difference(m, d.diff) + interval_text(row, m);
  out += !d.paired                              ? ", Welch's t"
         : d.n_a == row.n_a && d.n_b == row.n_b ? ", paired by seed"
                                                : fmt(", paired by seed over the %.0f both finished", d.n_a);
  if (row.no_spread) return out + ", no p-value";
  if (std::isfinite(row.boundary))
    out += ", " + p_text(d.p) + (d.p < row.boundary ? " < " : " >= ") + fmt("boundary %.3g", row.boundary);
  else if (std::isfinite(row.p_adjusted))
    out += ", adjusted " + p_text(row.p_adjusted);
  if (!std::isnan(d.effect)) out += fmt(d.paired ? ", d_z = %+.2f" : ", g = %+.2f", d.effect);
  for (const std::string* part : {&row.paper_effect, &row.equivalence})
    if (!part->empty()) out += "; " + *part;
  return out;
}

// e.g. "-62.5% executed (8.0000 -> 3.0000 GFLOPs per sequence; 3 and 3
// seeds), identical across seeds, against the claim's -62.5 ± 5.0%".
std::string describe_reduction(const TaskTest& row, const ClaimSpec& c, const Summary& s) {
  const MetricInfo& m = *metric_info(row.metric);
  if (row.n_a == 0 || row.n_b == 0) return row.a + " vs " + row.b + " (" + seeds_text(row, true) + ")";
  std::string out = row.test ? fmt("%.1f%% executed", -row.estimate)
                             : fmt("%.1f%% executed", -100.0 * (1.0 - row.mean_a / row.mean_b));
  out += " (" + shown(m, row.mean_b) + " -> " + shown(m, row.mean_a) + m.unit + "; " + seeds_text(row, true) + ")";
  if (!row.test) return out;
  out += row.no_spread ? ", the same on every seed" : fmt(", interval [%.1f%%, %.1f%%]", -row.hi, -row.lo);
  out += fmt(" against the claim's %.1f ± %.1f%%", -c.reduction, c.tolerance);
  return out + explain_attention_cut(s, c, row);
}

// e.g. "RBF share 3.0% (3 runs), [0.5%, 5.5%] against the claim's 10.0%".
std::string describe_share(const TaskTest& row, const ClaimSpec& c, const std::string& who) {
  const MetricInfo& m = *metric_info("share");
  if (row.n_a == 0) return row.a + " (" + seeds_text(row, false) + ")";
  const double share = row.test ? row.estimate : row.mean_a;  // the logit scale's mean once tested
  std::string out = who + " share " + shown(m, share) + " (" + seeds_text(row, false) + ")";
  if (!row.test) return out;
  out += row.no_spread ? ", identical across seeds" : ", [" + shown(m, row.lo) + ", " + shown(m, row.hi) + "]";
  return out + " against the claim's " + shown(m, c.threshold);
}

// ---- One verdict over a claim's tasks -------------------------------------

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The claim's tasks grouped by their verdicts.
struct TaskVerdicts {
  std::vector<std::string> holds, fails, open, lacking;  // lacking: "task (what it lacks)"
  size_t no_verdict = 0;
};

TaskVerdicts group_by_verdict(const Claim& claim) {
  TaskVerdicts g;
  for (const auto& row : claim.tasks) {
    if (row.verdict == v::kHolds) g.holds.push_back(row.task);
    if (row.verdict == v::kDoesNotHold) g.fails.push_back(row.task);
    if (row.verdict == v::kNotEnoughSeeds)
      g.lacking.push_back(row.task + " (" + (row.missing.empty() ? seeds_text(row, !row.b.empty()) : row.missing) +
                          ")");
    if (row.verdict == v::kNoVerdict) ++g.no_verdict;
  }
  // Inconclusive tasks first, then those with no verdict, each in the claim's order.
  for (const char* verdict : {v::kInconclusive, v::kNoVerdict})
    for (const auto& row : claim.tasks)
      if (row.verdict == verdict) g.open.push_back(row.task);
  return g;
}

// "holds on a, b; does not hold on c; open on d": the parts that have tasks.
std::string verdict_detail(const TaskVerdicts& g) {
  std::string out;
  for (const auto& [word, names] :
       {std::make_pair("holds", &g.holds), std::make_pair("does not hold", &g.fails), std::make_pair("open", &g.open)})
    if (!names->empty()) out += (out.empty() ? "" : "; ") + std::string(word) + " on " + joined(*names);
  return out;
}

// The combined direction against the paper: agrees or contradicts where
// every task with a direction does, "mixed" where tasks do both.
std::string combined_direction(const Claim& claim) {
  int agree = 0, contradict = 0, undecided = 0;
  for (const auto& row : claim.tasks) {
    agree += row.direction == "agrees";
    contradict += row.direction == "contradicts";
    undecided += row.direction == "undecided";
  }
  const int with = agree + contradict + undecided;
  if (with == 0) return "";
  if (agree && contradict) return "mixed";
  if (agree == with) return "agrees";
  if (contradict == with) return "contradicts";
  if (agree || contradict)
    return fmt(agree ? "agrees on %.0f of %.0f tasks" : "contradicts on %.0f of %.0f tasks",
               static_cast<double>(agree + contradict), static_cast<double>(with));
  return "undecided";
}

void combine(Claim& claim) {
  if (claim.tasks.empty()) {
    claim.verdict = v::kNotEnoughSeeds;
    return;
  }
  const TaskVerdicts g = group_by_verdict(claim);
  if (!g.lacking.empty()) {
    claim.verdict = v::kNotEnoughSeeds;
    claim.detail = "lacking on " + joined(g.lacking);
  } else if (!g.holds.empty() && !g.fails.empty()) {
    claim.verdict = v::kTaskDependent;
    claim.detail = verdict_detail(g);
  } else if ((!g.holds.empty() || !g.fails.empty()) && !g.open.empty()) {
    claim.verdict = v::kPartlyDecided;
    claim.detail = verdict_detail(g);
  } else if (!g.holds.empty()) {
    claim.verdict = v::kHolds;
  } else if (!g.fails.empty()) {
    claim.verdict = v::kDoesNotHold;
  } else {
    claim.verdict = g.no_verdict == claim.tasks.size() ? v::kNoVerdict : v::kInconclusive;
  }
  if (claim.tasks.size() == 1 && claim.verdict != v::kNotEnoughSeeds) claim.detail.clear();
  claim.direction = combined_direction(claim);
}

// A claim's rows, one per task it is about, measured but not yet decided.
Claim measure_claim(const ClaimSpec& c, const Summary& s, const std::string& baseline,
                    const SequentialLooks* sequential) {
  const auto variant = [&](size_t i) { return c.variants[i] == kBaseline ? baseline : c.variants[i]; };
  Claim out;
  out.id = c.id;
  out.kind = c.kind;
  out.claim = c.text;
  for (double p : c.paper) out.paper += (out.paper.empty() ? "" : " vs ") + fmt("%g", p);
  const std::string a = variant(0), b = c.kind == "share" ? "" : variant(1);
  for (const auto& t : s.tasks) {
    if (!claim_is_about(c, t.task, t.family)) continue;
    int limit = 0;  // a row a design looked at is tested on its look's seeds
    if (sequential && c.kind == "compare")
      if (const auto it = sequential->latest.find({c.id, t.task}); it != sequential->latest.end())
        limit = sequential->seeds.at(static_cast<size_t>(it->second.round));
    if (tests_a_difference(c.kind))
      out.tasks.push_back(compare_on(c, s, t, a, b, limit));
    else if (c.kind == "reduction")
      out.tasks.push_back(reduction_on(c, s, t, a, b));
    else
      out.tasks.push_back(share_on(c, s, t, a));
  }
  if (out.tasks.empty()) out.measured = needs(c, b.empty() ? "finished " + a + " runs" : a + " and " + b);
  return out;
}

// How a share claim names what it counts: the operators its rows saw, in
// registry order, by their display names ("RBF", "DCT + Fourier").
std::string share_subject(const ClaimSpec& c, const Summary& s, const std::string& variant) {
  std::vector<std::string> seen;
  for (const auto& r : s.runs) {
    if (r.variant != variant) continue;
    for (const auto& [op, value] : r.final_share) {
      const bool counted = c.op.empty() ? s.operators.traits(op).role == role_of(c.role) : op == c.op;
      if (counted && std::find(seen.begin(), seen.end(), op) == seen.end()) seen.push_back(op);
    }
  }
  std::sort(seen.begin(), seen.end(), [&](const std::string& x, const std::string& y) {
    return s.operators.order(x) != s.operators.order(y) ? s.operators.order(x) < s.operators.order(y) : x < y;
  });
  std::string who;
  for (const auto& op : seen) who += (who.empty() ? "" : " + ") + s.operators.traits(op).display_name;
  return who.empty() ? (c.op.empty() ? c.role : c.op) : who;
}

}  // namespace

std::string claims_fingerprint(const std::vector<ClaimSpec>& claims) {
  std::string text;
  const auto add = [&](const std::string& x) { text += x + '\x1f'; };
  for (const auto& c : claims) {
    for (const auto* x : {&c.id, &c.kind, &c.task, &c.family, &c.op, &c.role}) add(*x);
    for (const auto* list : {&c.variants, &c.metrics, &c.better})
      for (const auto& x : *list) add(x);
    add(fmt("%.17g %.17g %.17g", c.reduction, c.tolerance, c.threshold));
    text += '\x1e';
  }
  // FNV-1a, 64 bits: the same on every platform, unlike std::hash.
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ULL;
  char buf[32];
  std::snprintf(buf, sizeof buf, "claims:%016llx", static_cast<unsigned long long>(h));
  return buf;
}

bool row_is_tested(const ClaimSpec& c) { return !(c.kind == "reduction" && metric_info(c.metrics.front())->exact); }

bool tests_a_difference(const std::string& kind) { return kind == "compare" || kind == "equivalent"; }

bool claim_is_about(const ClaimSpec& c, const std::string& task, const std::string& family) {
  if (!c.family.empty()) return family == c.family;
  return is_pattern(c.task) ? matches(c.task, task) : task == c.task;
}

namespace {

// A row from several code states (or a dirty tree) gets no verdict unless
// mixed code is allowed; either way the row says so.
void guard_code(TaskTest& row, bool allow) {
  if (row.mixed_code.empty() || !row.test) return;
  const std::string why = (allow ? "mixed code, judged as --allow-mixed-code asks: " : "mixed code: ") + row.mixed_code;
  row.note = row.note.empty() ? why : row.note + "; " + why;
  if (allow) return;
  row.note += "; no verdict (chiar report --allow-mixed-code judges it anyway)";
  row.verdict = verdict::kNoVerdict;
  row.direction.clear();
}

}  // namespace

ClaimsTable evaluate_claims(const std::vector<ClaimSpec>& claims, const Summary& s, const std::string& baseline,
                            const ClaimsOptions& options) {
  ClaimsTable table;
  table.mixed_code_allowed = options.allow_mixed_code;
  const SequentialLooks* sequential = options.sequential;
  if (sequential && sequential->claims != claims_fingerprint(claims)) {
    table.sequential =
        "The store holds a sequential design made for other claims than these: its boundaries are "
        "not used here.";
    sequential = nullptr;
  }
  if (sequential) table.sequential = sequential->design;
  for (const auto& c : claims) table.claims.push_back(measure_claim(c, s, baseline, sequential));
  // The family of tests: rows with a spread that are judged.
  const auto counted = [&](const TaskTest& row) {
    return tested(row) && (options.allow_mixed_code || row.mixed_code.empty());
  };
  for (const auto& claim : table.claims)
    for (const auto& row : claim.tasks) table.tests += counted(row);
  table.confidence = 1 - kAlpha / std::max(1, table.tests);
  // Holm's adjusted p-values of the comparisons, for the export: never
  // larger than Bonferroni's, which the verdicts use.
  std::vector<double> p;
  for (const auto& claim : table.claims)
    for (const auto& row : claim.tasks)
      if (claim.kind == "compare" && counted(row)) p.push_back(row.test->p);
  const std::vector<double> holm = holm_adjusted(p);
  size_t next = 0;
  for (size_t i = 0; i < claims.size(); ++i) {
    Claim& claim = table.claims[i];
    const ClaimSpec& c = claims[i];
    const std::string who =
        c.kind == "share" ? share_subject(c, s, c.variants[0] == kBaseline ? baseline : c.variants[0]) : "";
    for (auto& row : claim.tasks) {
      if (c.kind == "compare") {
        if (counted(row)) row.p_holm = holm[next++];
        const SequentialLookState* look = nullptr;
        if (sequential)
          if (const auto it = sequential->latest.find({c.id, row.task}); it != sequential->latest.end())
            look = &it->second;
        decide_compare(row, c, table, look, sequential ? sequential->rounds : 0);
        guard_code(row, options.allow_mixed_code);
        row.measured = describe_compare(row);
      } else if (c.kind == "equivalent") {
        decide_equivalent(row, c, table);
        guard_code(row, options.allow_mixed_code);
        row.measured = describe_compare(row);
      } else if (c.kind == "reduction") {
        decide_reduction(row, c, table);
        guard_code(row, options.allow_mixed_code);
        row.measured = describe_reduction(row, c, s);
      } else {
        decide_share(row, c, table);
        guard_code(row, options.allow_mixed_code);
        row.measured = describe_share(row, c, who);
      }
    }
    combine(claim);
  }
  return table;
}

Claim evaluate_claim(const ClaimSpec& c, const Summary& s, const std::string& baseline) {
  return evaluate_claims({c}, s, baseline).claims.front();
}

}  // namespace chiar::report
