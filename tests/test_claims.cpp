// Claims: per-task verdicts combined over a claim's tasks, one simultaneous
// level for every interval, the paper's effect and equivalence, degenerate
// inputs, and the claims export. Expected intervals are computed here from
// Student's t written from its density, not from Boost.Math.
#include <sys/stat.h>

#include <boost/filesystem.hpp>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <sstream>

#include "engine/store/sqlite.h"
#include "engine/store/store.h"
#include "report/claims.h"
#include "report/claims_export.h"
#include "report/tabular.h"
#include "report/verdict_stats.h"
#include "support/faults.h"
#include "support/fixtures.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

#include <boost/filesystem.hpp>

using namespace chiar;
using test::TempDir;

namespace {

// ---- Student's t from its density, for expected values -------------------

double t_density(double x, double df) {
  return std::exp(std::lgamma((df + 1) / 2) - std::lgamma(df / 2)) / std::sqrt(df * M_PI) *
         std::pow(1 + x * x / df, -(df + 1) / 2);
}

// P(T > x) for x >= 0, by Simpson's rule on [0, x].
double t_tail(double x, double df) {
  const int n = 20000;
  const double h = x / n;
  double sum = t_density(0, df) + t_density(x, df);
  for (int i = 1; i < n; ++i) sum += (i % 2 ? 4 : 2) * t_density(i * h, df);
  return 0.5 - sum * h / 3;
}

// The t with P(T > t) = tail, by bisection.
double t_quantile(double tail, double df) {
  double lo = 0, hi = 200;
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (t_tail(mid, df) > tail ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

struct Sample {
  double mean, se, df;
};

// The mean of a - b per seed, its standard error and degrees of freedom.
Sample paired(const std::vector<double>& a, const std::vector<double>& b) {
  const double n = static_cast<double>(a.size());
  double m = 0, ss = 0;
  for (size_t i = 0; i < a.size(); ++i) m += (a[i] - b[i]) / n;
  for (size_t i = 0; i < a.size(); ++i) ss += (a[i] - b[i] - m) * (a[i] - b[i] - m);
  return {m, std::sqrt(ss / (n - 1) / n), n - 1};
}

std::string shown(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// ---- Fixture stores ------------------------------------------------------

report::Summary summary_of(const std::string& db) {
  return report::summarize(db, report::OperatorCatalog(test::plugins()));
}

engine::RunSpec spec(const std::string& variant, const std::string& task, int64_t seed, const std::string& family) {
  engine::RunSpec r;
  r.matrix = "claims";
  r.variant = variant;
  r.task = task;
  r.seed = seed;
  r.task_family = family;
  r.canonical = variant + "/" + task + "/" + std::to_string(seed);
  r.hash = "h" + std::to_string(std::hash<std::string>{}(r.canonical) % 1000000007);
  return r;
}

// task -> variant -> the test metric per seed (NaN: the run failed).
using Values = std::map<std::string, std::map<std::string, std::vector<double>>>;

// A store whose runs score `values` on `metric`, every task in `family`.
std::string store_of(const TempDir& d, const std::string& name, const Values& values, const std::string& metric,
                     const std::string& family = "") {
  const std::string db = d.path() + "/" + name;
  engine::Store store(db);
  std::vector<engine::RunSpec> runs;
  for (const auto& [task, variants] : values)
    for (const auto& [variant, per_seed] : variants)
      for (size_t seed = 0; seed < per_seed.size(); ++seed)
        runs.push_back(spec(variant, task, static_cast<int64_t>(seed), family));
  store.register_runs(runs);
  for (const auto& r : runs) {
    store.claim(r, engine::Provenance{});
    const double value = values.at(r.task).at(r.variant)[static_cast<size_t>(r.seed)];
    if (std::isnan(value)) {
      store.finish(r.hash, engine::RunStatus::Failed, "out of memory", -1, {});
      continue;
    }
    store.add_metrics(r.hash, 10, "test", "best", {{metric, value}});
    store.finish(r.hash, engine::RunStatus::Done, "", -1, {});
  }
  return db;
}

// A claim of `kind` about a and b on every task.
report::ClaimSpec claim_about(const std::string& kind, const std::string& a, const std::string& b,
                              const std::string& metric, const std::string& better) {
  report::ClaimSpec c;
  c.id = a + "_" + kind + "_" + b;
  c.text = a + " " + kind + " " + b;
  c.kind = kind;
  c.task = "*";
  c.variants = {a, b};
  c.metrics = {metric};
  c.better = {better};
  return c;
}

report::ClaimSpec compare(const std::string& a, const std::string& b, const std::string& metric,
                          const std::string& better) {
  auto c = claim_about("compare", a, b, metric, better);
  c.id = a + "_beats_" + b;
  c.text = a + " beats " + b;
  return c;
}

// `chiar report` of db with a claims file of `body` (its [[claims]] tables,
// over the variants fast and slow) into d/r/name; what it printed.
std::string report_with_claims(const TempDir& d, const std::string& db, const std::string& name,
                               const std::string& body) {
  d.write("variants.toml", "[variants.fast]\n[variants.slow]\n");
  const std::string claims = d.write(name + ".toml", "include = [\"variants.toml\"]\n\n" + body);
  const auto out =
      test::run_chiar({"report", db, "--out", d.path() + "/r/" + name, "--baseline", "slow", "--claims", claims});
  INFO(out.output);
  REQUIRE(out.status == 0);
  return out.output;
}

const std::vector<double> kFast = {30.1, 31.5, 29.8, 30.6}, kSlow = {35.2, 36.9, 34.1, 35.5};
const std::vector<double> kFast2 = {40, 42, 41, 43}, kSlow2 = {35, 36.5, 35.5, 37};

}  // namespace

TEST_CASE("claims: one holding task and one contradicting make a task-dependent claim; intervals simultaneous",
          "[report][claims]") {
  TempDir d("claims-task-dependent");
  const std::string db =
      store_of(d, "td.db", {{"lm", {{"fast", kFast}, {"slow", kSlow}}}, {"lm2", {{"fast", kFast2}, {"slow", kSlow2}}}},
               "token_ppl", "text");
  auto c = compare("fast", "slow", "token_ppl", "lower");
  c.task.clear();
  c.family = "text";
  c.paper = {10, 20};
  const auto table = report::evaluate_claims({c}, summary_of(db), "slow");
  // Two tests, so each interval is at 1 - 0.05 / 2 = 97.5%.
  CHECK(table.tests == 2);
  CHECK(table.confidence == Approx(0.975));
  const auto& claim = table.claims.at(0);
  CHECK(claim.verdict == "task-dependent");
  CHECK(claim.detail == "holds on lm; does not hold on lm2");
  CHECK(claim.direction == "mixed");
  REQUIRE(claim.tasks.size() == 2);
  const auto& lm = claim.tasks[0];
  const auto& lm2 = claim.tasks[1];
  CHECK(lm.label == "lm (family: text)");
  CHECK(lm.verdict == "holds");
  CHECK(lm.direction == "agrees");
  CHECK(lm2.verdict == "does not hold");
  CHECK(lm2.direction == "contradicts");
  // Bonferroni: mean -/+ t(1 - 0.0125, 3 df) se; the raw interval at 95%.
  for (const auto* row : {&lm, &lm2}) {
    const Sample s = row == &lm ? paired(kFast, kSlow) : paired(kFast2, kSlow2);
    const double q = t_quantile(0.0125, s.df), q95 = t_quantile(0.025, s.df);
    CHECK(row->estimate == Approx(s.mean).epsilon(1e-12));
    CHECK(row->lo == Approx(s.mean - q * s.se).epsilon(1e-6));
    CHECK(row->hi == Approx(s.mean + q * s.se).epsilon(1e-6));
    CHECK(row->raw_lo == Approx(s.mean - q95 * s.se).epsilon(1e-6));
    CHECK(row->raw_hi == Approx(s.mean + q95 * s.se).epsilon(1e-6));
    const double p = 2 * t_tail(std::abs(s.mean) / s.se, s.df);
    CHECK(row->p_adjusted == Approx(std::min(1.0, 2 * p)).epsilon(1e-5));
  }
  CHECK(lm.measured == "fast 30.50 vs slow 35.42 (4 and 4 seeds); difference -4.92 [" + shown("%+.2f", lm.lo) + ", " +
                           shown("%+.2f", lm.hi) + "], paired by seed, adjusted p " +
                           (lm.p_adjusted < 0.001 ? std::string("< 0.001") : "= " + shown("%.3f", lm.p_adjusted)) +
                           ", d_z = " + shown("%+.2f", lm.test->effect));
}

TEST_CASE("claims: decided on some tasks and open on the rest is partly decided; a NaN metric gives no verdict",
          "[report][claims]") {
  TempDir d("claims-partly");
  const std::vector<double> noisy_a = {30, 40, 35}, noisy_b = {36, 31, 38};
  const std::string db =
      store_of(d, "p.db", {{"lm", {{"fast", kFast}, {"slow", kSlow}}}, {"lm2", {{"fast", noisy_a}, {"slow", noisy_b}}}},
               "token_ppl");
  const auto claim = report::evaluate_claim(compare("fast", "slow", "token_ppl", "lower"), summary_of(db), "slow");
  CHECK(claim.verdict == "partly decided");
  CHECK(claim.detail == "holds on lm; open on lm2");
  CHECK(claim.tasks[1].verdict == "inconclusive");
  CHECK(claim.direction.empty());  // the claim gives no paper values

  // A NaN test metric on one seed: the difference is NaN, and no verdict.
  auto s = summary_of(db);
  for (auto& r : s.runs)
    if (r.task == "lm" && r.variant == "fast" && r.seed == 0) r.test_best["token_ppl"] = std::nan("");
  const auto none = report::evaluate_claim(compare("fast", "slow", "token_ppl", "lower"), s, "slow");
  CHECK(none.tasks.at(0).verdict == "no verdict");
  CHECK(none.tasks.at(0).note == "a metric is NaN");
  CHECK(none.verdict == "inconclusive");  // lm2 is open too: nothing decided
}

TEST_CASE("claims: the paper's effect inside or outside our interval; equivalence by two one-sided tests",
          "[report][claims]") {
  TempDir d("claims-effect");
  const std::vector<double> a = {0.801, 0.812, 0.795, 0.806, 0.790}, b = {0.798, 0.809, 0.799, 0.803, 0.792};
  const std::string db = store_of(d, "e.db", {{"cls", {{"full", a}, {"dct", b}}}}, "accuracy");
  auto c = compare("full", "dct", "accuracy", "higher");
  c.paper = {98.85, 63.35};
  const Sample s = paired(a, b);
  const double q = t_quantile(0.025, s.df);  // one test: the interval is the 95% one
  const double lo = (s.mean - q * s.se) * 100, hi = (s.mean + q * s.se) * 100;
  const auto judge = [&](double effect, double margin) {
    c.effect = effect;
    c.margin = margin;
    return report::evaluate_claim(c, summary_of(db), "dct").tasks.at(0);
  };
  // The paper's 35.5 points lie far above our interval: ruled out.
  const auto far = judge(35.5, NAN);
  CHECK(far.verdict == "inconclusive");
  CHECK(far.direction == "undecided");
  CHECK(far.paper_effect == "rules out the paper's +35.50 pp: at most " + shown("%+.2f", hi) + " pp");
  CHECK(far.equivalence.empty());
  CHECK(judge(-5, NAN).paper_effect == "rules out the paper's -5.00 pp: at least " + shown("%+.2f", lo) + " pp");
  CHECK(judge(0.2, NAN).paper_effect == "compatible with the paper's +0.20 pp");
  // Equivalence within 1 point: both one-sided tests reject, i.e. the 90%
  // interval lies inside (-1, +1) pp.
  const double q90 = t_quantile(0.05, s.df);
  REQUIRE(s.mean - q90 * s.se > -0.01);
  REQUIRE(s.mean + q90 * s.se < 0.01);
  const double tost = std::max(t_tail((0.01 + s.mean) / s.se, s.df), t_tail((0.01 - s.mean) / s.se, s.df));
  const auto within = judge(35.5, 1.0);
  CHECK(within.equivalence_p == Approx(tost).epsilon(1e-5));
  CHECK(within.equivalence == "equivalent within ±1.00 pp (two one-sided tests, adjusted p " +
                                  (tost < 0.001 ? std::string("< 0.001") : "= " + shown("%.3f", tost)) + ")");
  CHECK_THAT(within.measured, Catch::Matchers::EndsWith("; " + within.paper_effect + "; " + within.equivalence));
  // Within a tenth of a point it is not shown: the 90% interval is wider.
  REQUIRE(s.mean + q90 * s.se > 0.001);
  CHECK_THAT(judge(35.5, 0.1).equivalence, Catch::Matchers::StartsWith("not shown equivalent within ±0.10 pp"));
  // A margin below the metric's decimals is shown with the digits it needs.
  CHECK_THAT(judge(35.5, 0.004).equivalence, Catch::Matchers::StartsWith("not shown equivalent within ±0.004 pp"));
  CHECK_THAT(judge(35.5, 0.0055).equivalence, Catch::Matchers::StartsWith("not shown equivalent within ±0.0055 pp"));

  // A ratio: perplexity 0.86 of the other's against the paper's 0.5485.
  const std::string lm = store_of(d, "r.db", {{"lm", {{"fast", kFast}, {"slow", kSlow}}}}, "token_ppl");
  auto r = compare("fast", "slow", "token_ppl", "lower");
  r.effect_ratio = 0.5485;
  std::vector<double> log_fast, log_slow;
  for (double x : kFast) log_fast.push_back(std::log(x));
  for (double x : kSlow) log_slow.push_back(std::log(x));
  const Sample logs = paired(log_fast, log_slow);
  const double ql = t_quantile(0.025, logs.df);
  const auto ratio = report::evaluate_claim(r, summary_of(lm), "slow").tasks.at(0);
  CHECK(ratio.verdict == "holds");
  CHECK(ratio.direction == "agrees");
  CHECK(ratio.paper_effect == "ratio " + shown("%.3f", std::exp(logs.mean)) + " [" +
                                  shown("%.3f", std::exp(logs.mean - ql * logs.se)) + ", " +
                                  shown("%.3f", std::exp(logs.mean + ql * logs.se)) + "] rules out the paper's 0.5485");
}

TEST_CASE("claims: an equivalent claim holds inside its margin by two one-sided tests, fails wholly outside it",
          "[report][claims]") {
  TempDir d("claims-equivalent");
  const std::vector<double> a = {0.801, 0.812, 0.795, 0.806, 0.790}, b = {0.798, 0.809, 0.799, 0.803, 0.792};
  const std::string db = store_of(d, "e.db", {{"cls", {{"bf16", a}, {"fp32", b}}}}, "accuracy");
  auto c = claim_about("equivalent", "bf16", "fp32", "accuracy", "");
  c.id = "same";
  const Sample s = paired(a, b);
  const double q90 = t_quantile(0.05, s.df), q95 = t_quantile(0.025, s.df);
  const auto judge = [&](double margin) {
    c.margin = margin;
    return report::evaluate_claim(c, summary_of(db), "fp32").tasks.at(0);
  };
  // Within 1 point: the 90% interval lies inside (-1, +1) pp, so both
  // one-sided tests reject.
  REQUIRE(s.mean - q90 * s.se > -0.01);
  REQUIRE(s.mean + q90 * s.se < 0.01);
  const auto within = judge(1.0);
  CHECK(within.verdict == "holds");
  CHECK(within.direction.empty());
  const double tost = std::max(t_tail((0.01 + s.mean) / s.se, s.df), t_tail((0.01 - s.mean) / s.se, s.df));
  CHECK(within.equivalence_p == Approx(tost).epsilon(1e-5));
  CHECK_THAT(within.equivalence, Catch::Matchers::StartsWith("equivalent within ±1.00 pp"));
  CHECK(within.lo == Approx(s.mean - q95 * s.se).epsilon(1e-6));
  CHECK_THAT(within.measured, Catch::Matchers::StartsWith("bf16 " + shown("%.2f%%", 100 * 0.8008) + " vs fp32 "));
  CHECK_THAT(within.measured, Catch::Matchers::EndsWith("; " + within.equivalence));
  // Its p is the two one-sided tests'; none against zero is shown.
  CHECK(std::isnan(within.p_adjusted));
  CHECK(within.measured.find("adjusted p") == within.measured.rfind("adjusted p"));  // once: the TOST's
  CHECK_THAT(within.measured, Catch::Matchers::Contains("paired by seed, d_z = "));
  // Within a tenth of a point: not shown, and not ruled out either (the 95%
  // interval holds 0).
  REQUIRE(s.mean - q95 * s.se < 0);
  REQUIRE(s.mean + q95 * s.se > 0);
  const auto tight = judge(0.1);
  CHECK(tight.verdict == "inconclusive");
  CHECK_THAT(tight.equivalence, Catch::Matchers::StartsWith("not shown equivalent within ±0.10 pp"));
  // Perplexities about 5 apart against a margin of 1: the interval lies
  // wholly below -1, so the claim does not hold; against 10 it holds.
  const std::string lm = store_of(d, "lm.db", {{"lm", {{"fast", kFast}, {"slow", kSlow}}}}, "token_ppl");
  report::ClaimSpec r = c;
  r.variants = {"fast", "slow"};
  r.metrics = {"token_ppl"};
  const Sample ls = paired(kFast, kSlow);
  const double lq95 = t_quantile(0.025, ls.df);
  REQUIRE(ls.mean + lq95 * ls.se < -1);
  r.margin = 1;
  const auto apart = report::evaluate_claim(r, summary_of(lm), "slow");
  CHECK(apart.verdict == "does not hold");
  CHECK(apart.tasks.at(0).hi == Approx(ls.mean + lq95 * ls.se).epsilon(1e-6));
  r.margin = 10;
  const auto table = report::evaluate_claims({r}, summary_of(lm), "slow");
  CHECK(table.claims.at(0).verdict == "holds");
  // Exported with its test, p-value and effect size, as a compare row is.
  std::ostringstream csv;
  report::write_claims_csv(table, csv);
  const auto& row = table.claims[0].tasks[0];
  CHECK_THAT(csv.str(), Catch::Matchers::Contains("\nsame,equivalent,holds,,lm,token_ppl,fast,slow,4,4,"));
  CHECK_THAT(csv.str(), Catch::Matchers::Contains(",paired,3," + report::number_cell(row.test->p) + ","));
  CHECK_THAT(csv.str(), Catch::Matchers::Contains("," + report::number_cell(row.equivalence_p) + ",holds,"));
  // A report with such a claim says above its claims table how it is decided.
  report_with_claims(d, lm, "e",
                     "[[claims]]\nid = \"same\"\ntext = \"fast matches slow\"\nkind = \"equivalent\"\n"
                     "variants = [\"fast\", \"slow\"]\nmetric = \"token_ppl\"\nmargin = 10\n");
  const std::string md = test::read_text(d.path() + "/r/e.md");
  CHECK_THAT(md, Catch::Matchers::Contains("An equivalence (the two variants within the claim's margin) holds when two "
                                           "one-sided tests at the same adjusted level both reject (the narrower "
                                           "interval at 90.00% lies inside the margin)"));
  CHECK_THAT(md, Catch::Matchers::Contains("equivalent within ±10.00 (two one-sided tests, adjusted p "));
  CHECK_THAT(md, Catch::Matchers::Contains("| **holds** |"));
}

TEST_CASE("seed planning for equivalence: two one-sided tests' power against simulated designs", "[report][claims]") {
  // 20 paired seeds, differences of sd 0.021, a margin of 0.01436 (1% of
  // perplexity in bits), one test at 0.05: configs/bf16_equivalence.toml's
  // design. Its power at a true difference of 0, against 20,000 simulated
  // designs drawn here (seeded) and tested as the report tests them.
  const double sd = 0.021, margin = 0.01436;
  const int n = 20;
  const double bound = report::tost_power(margin, sd / std::sqrt(double(n)), n - 1, 0.05);
  std::mt19937_64 rng(2026);
  std::normal_distribution<double> draw(0.0, sd);
  const int designs = 20000;
  int shown_equivalent = 0;
  for (int k = 0; k < designs; ++k) {
    std::vector<double> diffs(n), zeros(n, 0.0);
    for (double& x : diffs) x = draw(rng);
    shown_equivalent += report::tost_p(report::paired_difference(diffs, zeros), margin) < 0.05;
  }
  const double simulated = double(shown_equivalent) / designs;
  // The bound is below the truth by the designs where neither test rejects,
  // which at this size are rare; 0.01 is four binomial standard errors.
  CHECK(bound == Approx(0.81).margin(0.01));
  CHECK(bound <= simulated + 0.01);
  CHECK(simulated - bound < 0.02);
  // The fewest seeds for 80%: 20 reach it, 19 do not.
  CHECK(report::seeds_for_equivalence(margin, true, sd, 0, 0.05, 0.8, 100) == 20);
  CHECK(report::tost_power(margin, sd / std::sqrt(19.0), 18, 0.05) < 0.8);
  // A margin inside the noise needs more than the cap.
  CHECK(report::seeds_for_equivalence(margin / 10, true, sd, 0, 0.05, 0.8, 50) == 0);
}

TEST_CASE("claims: a family task where a variant has no finished run is not enough seeds, named; no task drops out",
          "[report][claims]") {
  TempDir d("claims-missing");
  const double failed = std::nan("");
  const std::string db = store_of(d, "m.db",
                                  {{"lm", {{"fast", {30, 31, 33}}, {"slow", {35, 37, 36}}}},
                                   {"lm2", {{"fast", {30, 31, 33}}, {"slow", {failed}}}},
                                   {"lm3", {{"fast", {30, 31, 33}}}}},
                                  "token_ppl", "text");
  auto c = compare("fast", "slow", "token_ppl", "lower");
  c.task.clear();
  c.family = "text";
  const auto claim = report::evaluate_claim(c, summary_of(db), "slow");
  REQUIRE(claim.tasks.size() == 3);
  CHECK(claim.tasks[0].verdict == "holds");
  CHECK(claim.tasks[1].verdict == "not enough seeds");
  CHECK(claim.tasks[1].left_out == "slow 1 failed");
  CHECK(claim.tasks[1].missing == "slow has no finished run");
  CHECK(claim.tasks[1].measured ==
        "fast 31.33 vs slow (3 and 0 seeds; left out: slow 1 failed; slow has no finished run)");
  CHECK(claim.tasks[2].missing == "slow has no finished run");
  CHECK(claim.verdict == "not enough seeds");
  CHECK(claim.detail == "lacking on lm2 (slow has no finished run), lm3 (slow has no finished run)");
  // The same claim about a task the store does not hold.
  c.family.clear();
  c.task = "imdb";
  const auto absent = report::evaluate_claim(c, summary_of(db), "slow");
  CHECK(absent.tasks.empty());
  CHECK(absent.verdict == "not enough seeds");
  CHECK(absent.measured == "needs fast and slow on task imdb");
}

TEST_CASE("claims: runs identical across seeds get no p-value and decide nothing", "[report][claims]") {
  TempDir d("claims-no-spread");
  // slow is fast + 5 on every seed: the differences have no spread.
  const std::string db = store_of(
      d, "z.db", {{"lm", {{"fast", {30, 31, 32}}, {"slow", {35, 36, 37}}, {"same", {30, 31, 32}}}}}, "token_ppl");
  auto c = compare("fast", "slow", "token_ppl", "lower");
  c.paper = {1, 2};
  const auto table =
      report::evaluate_claims({c, compare("fast", "same", "token_ppl", "lower")}, summary_of(db), "slow");
  CHECK(table.tests == 0);
  const auto& row = table.claims[0].tasks.at(0);
  CHECK(row.no_spread);
  CHECK(std::isnan(row.p_adjusted));
  CHECK(row.verdict == "inconclusive");
  CHECK(row.direction == "undecided");
  CHECK(row.note ==
        "identical across seeds: every seed gives the same difference, so there is no spread to test it against and "
        "no p-value");
  CHECK(row.measured ==
        "fast 31.00 vs slow 36.00 (3 and 3 seeds); difference -5.00, identical across seeds, paired by "
        "seed, no p-value");
  CHECK(table.claims[1].tasks.at(0).verdict == "inconclusive");  // the same numbers under two names
}

namespace {

// Finished runs of variant "hard" on each task whose routed layer ends with
// the given RBF shares.
std::string share_store(const TempDir& d, const std::string& name,
                        const std::map<std::string, std::vector<double>>& rbf) {
  const std::string db = d.path() + "/" + name;
  engine::Store store(db);
  std::vector<engine::RunSpec> runs;
  for (const auto& [task, shares] : rbf)
    for (size_t seed = 0; seed < shares.size(); ++seed)
      runs.push_back(spec("hard", task, static_cast<int64_t>(seed), ""));
  store.register_runs(runs);
  for (const auto& r : runs) {
    store.claim(r, engine::Provenance{});
    const double share = rbf.at(r.task)[static_cast<size_t>(r.seed)];
    store.add_routing(r.hash, 10, 1, {{"dct", 0.5}, {"rbf", share}, {"attention", 0.5 - share}},
                      std::vector<int64_t>(20, 1));
    store.finish(r.hash, engine::RunStatus::Done, "", -1, {});
  }
  return db;
}

double logit(double p) { return std::log(p / (1 - p)); }
double expit(double x) { return 1 / (1 + std::exp(-x)); }

}  // namespace

TEST_CASE("claims: a share is judged per task on the logit scale, so its interval stays inside [0, 1]",
          "[report][claims]") {
  TempDir d("claims-share");
  const std::vector<double> near_zero = {0.001, 0.002, 0.0015}, spread = {0.05, 0.09, 0.13}, high = {0.30, 0.31, 0.32};
  const std::string db = share_store(d, "s.db", {{"a_low", near_zero}, {"b_spread", spread}, {"c_high", high}});
  report::ClaimSpec c;
  c.id = "collapse";
  c.text = "hard rejects RBF";
  c.kind = "share";
  c.task = "*";
  c.variants = {"hard"};
  c.metrics = {"share"};
  c.better = {"lower"};
  c.op = "rbf";
  c.threshold = 0.10;
  const auto table = report::evaluate_claims({c}, summary_of(db), "hard");
  CHECK(table.tests == 3);
  const auto& claim = table.claims.at(0);
  REQUIRE(claim.tasks.size() == 3);
  const auto& low = claim.tasks[0];
  // On the raw scale this interval would run below zero (mean 0.15%, sd
  // 0.05%, t(0.9917, 2) 7.65 standard errors of 0.029%); on the logit scale
  // it is expit(mean logit -/+ t se), inside (0, 1).
  std::vector<double> logits;
  for (double v : near_zero) logits.push_back(logit(v));
  double m = 0, ss = 0;
  for (double v : logits) m += v / 3;
  for (double v : logits) ss += (v - m) * (v - m);
  const double se = std::sqrt(ss / 2 / 3), q = t_quantile(0.05 / 3 / 2, 2);
  CHECK(low.lo == Approx(expit(m - q * se)).epsilon(1e-6));
  CHECK(low.hi == Approx(expit(m + q * se)).epsilon(1e-6));
  CHECK(low.lo > 0);
  CHECK(low.hi < c.threshold);
  CHECK(low.verdict == "holds");
  CHECK(claim.tasks[1].verdict == "inconclusive");  // 9% mean, but the interval spans 10%
  CHECK(claim.tasks[2].verdict == "does not hold");
  CHECK(claim.tasks[2].lo > 0.10);
  CHECK(claim.tasks[2].hi < 1);
  CHECK(claim.verdict == "task-dependent");
  CHECK(claim.detail == "holds on a_low; does not hold on c_high; open on b_spread");
  CHECK_THAT(low.measured, Catch::Matchers::StartsWith("RBF share 0.1% (3 runs), ["));
  CHECK_THAT(low.measured, Catch::Matchers::EndsWith("] against the claim's 10.0%"));
  // Two runs are not enough.
  const auto two = report::evaluate_claim(c, summary_of(share_store(d, "two.db", {{"lm", {0.01, 0.01}}})), "hard");
  CHECK(two.verdict == "not enough seeds");
}

TEST_CASE("claims: a reduction is decided on the per-seed cut's interval against the tolerance band",
          "[report][claims]") {
  TempDir d("claims-reduction");
  // Perplexity cut per seed: 1 - 30/60, 1 - 31/60, 1 - 29/61: about 49-52%.
  const std::string db = store_of(d, "r.db", {{"lm", {{"small", {30, 31, 29}}, {"big", {60, 60, 61}}}}}, "token_ppl");
  report::ClaimSpec c;
  c.id = "cut";
  c.text = "small halves big";
  c.kind = "reduction";
  c.task = "*";
  c.variants = {"small", "big"};
  c.metrics = {"token_ppl"};
  c.better = {"lower"};
  c.reduction = 50;
  std::vector<double> cuts = {100 * (1 - 30.0 / 60), 100 * (1 - 31.0 / 60), 100 * (1 - 29.0 / 61)};
  double m = 0, ss = 0;
  for (double v : cuts) m += v / 3;
  for (double v : cuts) ss += (v - m) * (v - m);
  const double half = t_quantile(0.025, 2) * std::sqrt(ss / 2 / 3);
  const auto judge = [&](double tolerance) {
    c.tolerance = tolerance;
    return report::evaluate_claim(c, summary_of(db), "big").tasks.at(0);
  };
  const auto wide = judge(10);  // the band 40-60% holds the whole interval
  CHECK(wide.estimate == Approx(m));
  CHECK(wide.lo == Approx(m - half).epsilon(1e-6));
  CHECK(wide.hi == Approx(m + half).epsilon(1e-6));
  REQUIRE(m - half > 40);
  REQUIRE(m + half < 60);
  CHECK(wide.verdict == "holds");
  CHECK(judge(0.5).verdict == "inconclusive");  // 49.5-50.5% cuts through the interval
  c.reduction = 80;
  CHECK(judge(5).verdict == "does not hold");  // 75-85%: wholly outside
}

TEST_CASE("claims export: one record per (claim, task), CSV and JSON", "[report][claims]") {
  TempDir d("claims-export");
  const std::string db =
      store_of(d, "x.db", {{"lm", {{"fast", kFast}, {"slow", kSlow}}}, {"lm2", {{"fast", kFast2}, {"slow", kSlow2}}}},
               "token_ppl");
  auto absent = compare("fast", "slow", "token_ppl", "lower");
  absent.id = "absent";
  absent.task = "imdb";
  const auto table =
      report::evaluate_claims({compare("fast", "slow", "token_ppl", "lower"), absent}, summary_of(db), "slow");
  std::ostringstream csv, json;
  report::write_claims_csv(table, csv);
  report::write_claims_json(table, json);
  std::vector<std::string> lines;
  std::istringstream in(csv.str());
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 4);  // the header, two tasks, the claim about no task
  CHECK_THAT(lines[0], Catch::Matchers::StartsWith("claim,kind,claim_verdict,claim_detail,task,metric,variant_a,"));
  CHECK_THAT(lines[1], Catch::Matchers::StartsWith("fast_beats_slow,compare,task-dependent,holds on lm; does not hold "
                                                   "on lm2,lm,token_ppl,fast,slow,4,4,"));
  CHECK_THAT(lines[3],
             Catch::Matchers::StartsWith("absent,compare,not enough seeds,,,,,,,,,needs fast and slow on task imdb,"));
  const auto& row = table.claims[0].tasks[0];
  CHECK_THAT(lines[1], Catch::Matchers::Contains("," + report::number_cell(row.lo) + "," + report::number_cell(row.hi) +
                                                 ",0.975,2,"));
  CHECK_THAT(json.str(), Catch::Matchers::Contains("\"verdict\": \"holds\""));
  CHECK_THAT(json.str(), Catch::Matchers::Contains("\"p_holm\": " + report::number_cell(row.p_holm)));
  CHECK_THAT(json.str(), Catch::Matchers::Contains("\"n_b\": null"));  // the claim about no task
}

TEST_CASE(
    "report claims: runs left out are named, pairs are the seeds both finished; a claim over several tasks "
    "needs all of them",
    "[report][claims]") {
  // Perplexity 10 + seed for a (seeds 0-2), 20 + seed for b (0-2; seed 3
  // diverged), 15 + seed for c (0-3), 30 + seed for d (10-12) on lm; lm2 has
  // a and b with 2 seeds each.
  TempDir d("claims-left-out");
  const std::string db = d.path() + "/left.db";
  {
    engine::Store store(db);
    std::vector<engine::RunSpec> runs;
    for (const char* v : {"a", "b"})
      for (int seed = 0; seed < 3; ++seed) runs.push_back(spec(v, "lm", seed, ""));
    runs.push_back(spec("b", "lm", 3, ""));
    for (int seed = 0; seed < 4; ++seed) runs.push_back(spec("c", "lm", seed, ""));
    for (int seed = 10; seed < 13; ++seed) runs.push_back(spec("d", "lm", seed, ""));
    for (const char* v : {"a", "b"})
      for (int seed = 0; seed < 2; ++seed) runs.push_back(spec(v, "lm2", seed, ""));
    store.register_runs(runs);
    for (const auto& r : runs) {
      store.claim(r, engine::Provenance{});
      if (r.variant == "b" && r.seed == 3) {
        store.finish(r.hash, engine::RunStatus::Diverged, "loss nan at step 2", 2, {});
        continue;
      }
      const std::map<std::string, double> base = {{"a", 10}, {"b", 20}, {"c", 15}, {"d", 30}};
      const double ppl = base.at(r.variant) + static_cast<double>(r.seed);
      store.add_metrics(r.hash, 10, "test", "best", {{"token_ppl", ppl}});
      engine::RunSummary sum;
      sum.tau = "{}";
      store.finish(r.hash, engine::RunStatus::Done, "", -1, sum);
    }
  }
  report::ClaimSpec c;
  c.id = "a-beats-b";
  c.text = "a beats b";
  c.kind = "compare";
  c.task = "lm";
  c.variants = {"a", "b"};
  c.metrics = {"token_ppl"};
  c.better = {"lower"};
  const auto one = report::evaluate_claim(c, summary_of(db), "a");
  CHECK(one.verdict == "inconclusive");  // 10 apart on every seed: no spread, no test
  CHECK(one.tasks.at(0).measured ==
        "a 11.00 vs b 21.00 (3 and 3 seeds; left out: b 1 diverged); difference -10.00, identical across seeds, "
        "paired by seed, no p-value");
  // c's seed 3 has no partner: the pairs are seeds 0-2, each 5 apart.
  c.variants = {"c", "b"};
  CHECK(report::evaluate_claim(c, summary_of(db), "a").tasks.at(0).measured ==
        "c 16.50 vs b 21.00 (4 and 3 seeds; left out: b 1 diverged); difference -5.00, identical across seeds, "
        "paired by seed over the 3 both finished, no p-value");
  // No seed in common: Welch's t, df 4 (t 2.776445), Hedges' g = 30 x (1 - 3/15).
  c.variants = {"d", "a"};
  const auto welch = report::evaluate_claim(c, summary_of(db), "a");
  CHECK(welch.verdict == "does not hold");
  CHECK(welch.tasks.at(0).measured ==
        "d 41.00 vs a 11.00 (3 and 3 seeds); difference +30.00 [+27.73, +32.27], Welch's t, adjusted p < 0.001, "
        "g = +24.00");
  c.variants = {"a", "b"};
  c.task = "lm*";
  const auto both = report::evaluate_claim(c, summary_of(db), "a");
  CHECK(both.tasks.size() == 2);
  CHECK(both.verdict == "not enough seeds");
}

TEST_CASE("verdict statistics: paired and Welch intervals, p-values, effect sizes, Holm", "[report][claims]") {
  // Reference values computed by hand from the definitions: Student's t
  // quantile and tail integrated numerically from its density.
  // Paired: differences 1, 1.5, 1, 2: mean 1.375, sd 0.478714, df 3.
  const auto paired = report::paired_difference({10, 12, 11, 13}, {9, 10.5, 10, 11});
  CHECK(paired.paired);
  CHECK(paired.diff == Approx(1.375));
  CHECK(paired.df == Approx(3));
  CHECK(paired.lo == Approx(0.6132599).epsilon(1e-6));
  CHECK(paired.hi == Approx(2.1367401).epsilon(1e-6));
  CHECK(paired.p == Approx(0.0104771).epsilon(1e-5));
  CHECK(paired.effect == Approx(2.8722813).epsilon(1e-6));  // d_z
  // Welch: 1,2,3 against 4,6,8,10: variances 1 and 6.667, df 4.0755.
  const auto welch = report::welch_difference({1, 2, 3}, {4, 6, 8, 10});
  CHECK_FALSE(welch.paired);
  CHECK(welch.diff == Approx(-5));
  CHECK(welch.df == Approx(4.0754717).epsilon(1e-6));
  CHECK(welch.lo == Approx(-8.8979755).epsilon(1e-6));
  CHECK(welch.hi == Approx(-1.1020245).epsilon(1e-6));
  CHECK(welch.p == Approx(0.0233768).epsilon(1e-5));
  CHECK(welch.effect == Approx(-2.0072897).epsilon(1e-6));  // Hedges' g
  // Identical results on every seed: no difference, p = 1.
  const auto same = report::paired_difference({5, 6, 7}, {5, 6, 7});
  CHECK(same.diff == 0);
  CHECK(same.lo == 0);
  CHECK(same.hi == 0);
  CHECK(same.p == 1);
  // Holm: sorted 0.005 0.01 0.03 0.04 -> x4 x3 x2 x1 = 0.02 0.03 0.06 0.04,
  // then made monotone: 0.02 0.03 0.06 0.06.
  const auto holm = report::holm_adjusted({0.01, 0.04, 0.03, 0.005});
  REQUIRE(holm.size() == 4);
  CHECK(holm[0] == Approx(0.03));
  CHECK(holm[1] == Approx(0.06));
  CHECK(holm[2] == Approx(0.06));
  CHECK(holm[3] == Approx(0.02));
  CHECK(report::holm_adjusted({0.6, 0.7}) == std::vector<double>{1.0, 1.0});
  // The interval at another level, from the same standard error.
  const auto at99 = report::interval_at(paired, 0.99);
  const double q99 = t_quantile(0.005, 3);
  CHECK(at99.lo == Approx(1.375 - q99 * paired.se).epsilon(1e-6));
  CHECK(at99.hi == Approx(1.375 + q99 * paired.se).epsilon(1e-6));
  CHECK(report::interval_at(same, 0.99).lo == 0);
  // Two one-sided tests against +-2: P(T > (1.375 + 2) / se) and P(T > (2 - 1.375) / se).
  CHECK(report::tost_p(paired, 2) ==
        Approx(std::max(t_tail(3.375 / paired.se, 3), t_tail(0.625 / paired.se, 3))).epsilon(1e-5));
  CHECK(std::isnan(report::tost_p(same, 2)));
}

TEST_CASE("seed planning: seeds for 80% power against textbook values", "[report][claims]") {
  // Paired t-test, two-sided alpha 0.05, power 0.80 (Cohen 1988; G*Power's
  // "matched pairs"): d_z 0.5 needs 34 pairs, d_z 0.8 needs 15, d_z 1.0 10.
  CHECK(report::seeds_for_power(0.5, true, 1.0, 0, 0.05, 0.8, 1000) == 34);
  CHECK(report::seeds_for_power(0.8, true, 1.0, 0, 0.05, 0.8, 1000) == 15);
  CHECK(report::seeds_for_power(1.0, true, 1.0, 0, 0.05, 0.8, 1000) == 10);
  // Two groups of equal spread (Welch's df is then 2n - 2): d 0.5 needs 64
  // per group, d 0.8 26.
  CHECK(report::seeds_for_power(0.5, false, 1.0, 1.0, 0.05, 0.8, 1000) == 64);
  CHECK(report::seeds_for_power(0.8, false, 1.0, 1.0, 0.05, 0.8, 1000) == 26);
  // A stricter level needs more: d_z 1.0 at alpha 0.05 / 10.
  CHECK(report::seeds_for_power(1.0, true, 1.0, 0, 0.005, 0.8, 1000) > 10);
  // Never fewer than the seeds a verdict needs, and 0 past the cap.
  CHECK(report::seeds_for_power(100, true, 1.0, 0, 0.05, 0.8, 1000) == report::kMinSeedsPerSide);
  CHECK(report::seeds_for_power(0.01, true, 1.0, 0, 0.05, 0.8, 50) == 0);
  // The power itself: d_z 0.5 with 34 pairs has 0.808 (G*Power).
  CHECK(report::t_test_power(0.5, 1 / std::sqrt(34.0), 33, 0.05) == Approx(0.8078).epsilon(2e-3));
}

TEST_CASE("chiar report --claims: a user's claim end to end, with its export", "[report][claims]") {
  TempDir d("user-claims");
  const std::string db = store_of(d, "u.db", {{"lm", {{"fast", kFast}, {"slow", kSlow}}}}, "token_ppl");
  const std::string output = report_with_claims(
      d, db, "u",
      "[[claims]]\nid = \"mine\"\ntext = \"fast beats slow\"\nkind = \"compare\"\ntask = \"lm\"\n"
      "variants = [\"fast\", \"slow\"]\nmetric = \"token_ppl\"\nbetter = \"lower\"\npaper = [10, 20]\n"
      "effect_ratio = 0.5\n");
  CHECK_THAT(output, Catch::Matchers::Contains("the claims table as " + d.path() + "/r/u-claims.csv and " + d.path() +
                                               "/r/u-claims.json"));
  const std::string md = test::read_text(d.path() + "/r/u.md");
  CHECK_THAT(md, Catch::Matchers::Contains("1 row has a spread to test. Every interval shown is simultaneous: each at "
                                           "95.00% (Bonferroni over 1 test)"));
  CHECK_THAT(md, Catch::Matchers::Contains("| claim | paper | task | measured | vs paper | verdict |"));
  CHECK_THAT(md, !Catch::Matchers::Contains("An equivalence"));  // said only where a claim is one
  CHECK_THAT(md, Catch::Matchers::Contains("| **fast beats slow** | 10 vs 20 | lm | fast 30.50 vs slow 35.42 (4 and 4 "
                                           "seeds); difference -4.92 ["));
  CHECK_THAT(md, Catch::Matchers::Contains("rules out the paper's 0.5 | agrees | **holds** |"));
  const std::string html = test::read_text(d.path() + "/r/u.html");
  CHECK_THAT(html, Catch::Matchers::Contains("<td class=\"holds\"><strong>holds</strong></td>"));
  const std::string csv = test::read_text(d.path() + "/r/u-claims.csv");
  CHECK_THAT(csv, Catch::Matchers::Contains("\nmine,compare,holds,,lm,token_ppl,fast,slow,4,4,"));
  CHECK_THAT(test::read_text(d.path() + "/r/u-claims.json"), Catch::Matchers::Contains("\"claim\": \"mine\""));
}

TEST_CASE("claims file: effects and margins are checked at file:line", "[report][claims][errors]") {
  TempDir d("claims-effect-file");
  d.write("variants.toml", "[variants.fast]\n[variants.slow]\n");
  const auto claim = [&](const std::string& kind, const std::string& extra) {
    return d.write(kind + ".toml", "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"x\"\ntext = \"x\"\nkind = \"" +
                                       kind +
                                       "\"\nvariants = [\"fast\", \"slow\"]\nmetric = \"token_ppl\"\n"
                                       "better = \"lower\"\n" +
                                       extra);
  };
  const auto good = report::load_claims(claim("compare", "effect = -3.5\nmargin = 0.5\n"));
  CHECK(good.at(0).effect == -3.5);
  CHECK(good.at(0).margin == 0.5);
  CHECK(std::isnan(good.at(0).effect_ratio));
  const std::string both = claim("compare", "effect = 1\neffect_ratio = 0.5\n");
  CHECK_THROWS_WITH(report::load_claims(both), both +
                                                   ":11:16: key 'claims[0].effect_ratio': a claim states its effect "
                                                   "as a difference or a ratio, not both");
  const std::string ratio = claim("compare", "effect_ratio = 0\n");
  CHECK_THROWS_WITH(report::load_claims(ratio),
                    ratio + ":10:16: key 'claims[0].effect_ratio': expected a ratio above 0");
  const std::string margin = claim("compare", "margin = -1\n");
  CHECK_THROWS_WITH(report::load_claims(margin), margin + ":10:10: key 'claims[0].margin': expected a margin above 0");
  const std::string reduction = claim("reduction", "reduction = 50\ntolerance = 5\nmargin = 1\n");
  CHECK_THROWS_WITH(report::load_claims(reduction),
                    reduction + ":12:10: key 'claims[0].margin': only a compare or an equivalent claim takes it");
  // An equivalent claim needs a margin, and has no better side or effect.
  const auto equivalent = [&](const std::string& name, const std::string& extra) {
    return d.write(name + ".toml",
                   "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"x\"\ntext = \"x\"\nkind = \"equivalent\"\n"
                   "variants = [\"fast\", \"slow\"]\nmetric = \"token_ppl\"\n" +
                       extra);
  };
  const auto same = report::load_claims(equivalent("same", "margin = 0.5\n"));
  CHECK(same.at(0).kind == "equivalent");
  CHECK(same.at(0).margin == 0.5);
  const std::string unbounded = equivalent("unbounded", "");
  CHECK_THROWS_WITH(report::load_claims(unbounded), unbounded + ":3:1: key 'claims[0].margin': missing");
  const std::string sided = equivalent("sided", "better = \"lower\"\nmargin = 0.5\n");
  CHECK_THROWS_WITH(report::load_claims(sided),
                    sided + ":9:10: key 'claims[0].better': an equivalent claim has no better side");
  const std::string effect = equivalent("effect", "margin = 0.5\neffect = 1\n");
  CHECK_THROWS_WITH(report::load_claims(effect),
                    effect + ":10:10: key 'claims[0].effect': only a compare claim takes it");
  const std::string typo = claim("compare", "efect = 1\n");
  CHECK_THROWS_WITH(report::load_claims(typo),
                    typo + ":10:9: key 'claims[0].efect': unknown key (did you mean 'effect'?)");
}

TEST_CASE("chiar plan: seeds from a pilot's spread at the report's level, as a table and as TOML", "[report][claims]") {
  TempDir d("plan");
  test::write_tiny_matrix(
      d, "name = \"m\"\nvariants = [\"base\", \"routed\"]\ntasks = [\"lm\", \"flat\"]\nseeds = [0, 1, 2]\n",
      test::tiny_train_body());
  const std::string pilot = store_of(d, "pilot.db", {{"lm", {{"routed", kFast}, {"base", kSlow}}}}, "token_ppl");
  const std::string claims = d.write(
      "claims.toml",
      "include = [\"m.toml\"]\n\n[[claims]]\nid = \"lm_only\"\ntext = \"routed beats base on lm\"\nkind = \"compare\"\n"
      "task = \"lm\"\nvariants = [\"routed\", \"base\"]\nmetric = \"token_ppl\"\nbetter = \"lower\"\neffect = -1.0\n\n"
      "[[claims]]\nid = \"everywhere\"\ntext = \"routed beats base\"\nkind = \"compare\"\ntask = \"*\"\n"
      "variants = [\"routed\", \"base\"]\nmetric = [\"token_ppl\", \"accuracy\"]\nbetter = [\"lower\", \"higher\"]\n"
      "margin = 0.5\n");
  const auto out = test::run_chiar({"plan", d.path() + "/m.toml", "--pilot", pilot, "--claims", claims, "--baseline",
                                    "base", "--out", d.path() + "/seeds.toml"});
  INFO(out.output);
  REQUIRE(out.status == 0);
  // The report will hold 3 rows (lm_only on lm; everywhere on lm and flat):
  // each comparison is planned at 0.05 / 3, paired from the pilot's spread.
  const Sample s = paired(kFast, kSlow);
  const double sd = s.se * std::sqrt(s.df + 1);
  const int for_effect = report::seeds_for_power(1.0, true, sd, 0, 0.05 / 3, 0.8, 50);
  const int for_margin = report::seeds_for_power(0.5, true, sd, 0, 0.05 / 3, 0.8, 50);
  REQUIRE(for_margin > for_effect);
  CHECK_THAT(out.output, Catch::Matchers::Contains("No pilot runs on task flat: its comparisons are not planned."));
  CHECK_THAT(out.output, Catch::Matchers::Contains("alpha 0.05 / 3 = 0.01667 per comparison"));
  CHECK_THAT(out.output, Catch::Matchers::Contains("Planned: " + std::to_string(for_margin) + " seeds"));
  const std::string toml = test::read_text(d.path() + "/seeds.toml");
  CHECK_THAT(toml, Catch::Matchers::Contains("# lm_only on lm: paired, sd " + shown("%.4g", sd) +
                                             " over 4 pilot seeds; the paper's effect -1 -> " +
                                             std::to_string(for_effect) + "\n"));
  CHECK_THAT(toml, Catch::Matchers::Contains("; margin 0.5 -> " + std::to_string(for_margin) + "\n"));
  std::string seeds = "[matrix]\nseeds = [";
  for (int i = 0; i < for_margin; ++i) seeds += (i ? ", " : "") + std::to_string(i);
  CHECK_THAT(toml, Catch::Matchers::EndsWith(seeds + "]\n"));
  // Bad input: exit 2, nothing written.
  const auto bad = test::run_chiar({"plan", d.path() + "/m.toml", "--pilot", pilot, "--claims", claims, "--power", "2",
                                    "--out", d.path() + "/bad.toml"});
  CHECK(bad.status == 2);
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/bad.toml"));
}

TEST_CASE("claims file: a share's threshold is a fraction, a reduction's tolerance not negative",
          "[report][claims][errors]") {
  TempDir d("claims-ranges");
  d.write("variants.toml", "[variants.fast]\n[variants.slow]\n");
  const std::string share =
      d.write("share.toml",
              "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"x\"\ntext = \"x\"\nkind = \"share\"\n"
              "variants = [\"fast\"]\nmetric = \"share\"\nbetter = \"lower\"\noperator = \"rbf\"\nthreshold = 1.5\n");
  CHECK_THROWS_WITH(report::load_claims(share),
                    share + ":11:13: key 'claims[0].threshold': expected a fraction between 0 and 1");
  const std::string cut =
      d.write("cut.toml",
              "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"x\"\ntext = \"x\"\nkind = \"reduction\"\n"
              "variants = [\"fast\", \"slow\"]\nmetric = \"attention_gflops\"\nbetter = \"lower\"\nreduction = 50\n"
              "tolerance = -1\n");
  CHECK_THROWS_WITH(report::load_claims(cut),
                    cut + ":11:13: key 'claims[0].tolerance': expected 0 or more percentage points");
}

TEST_CASE("provenance guard: a row whose runs come from several code states gets no verdict unless allowed",
          "[report][claims]") {
  TempDir d("claims-mixed-code");
  const std::string db = store_of(d, "mixed.db", {{"lm", {{"fast", kFast}, {"slow", kSlow}}}}, "token_ppl");
  const auto judge = [&](bool allow) {
    return report::evaluate_claims({compare("fast", "slow", "token_ppl", "lower")}, summary_of(db), "slow",
                                   {nullptr, allow});
  };
  const auto set = [&](const std::string& sql) { engine::Database(db).exec(sql); };
  set("UPDATE runs SET git_commit = 'aaaaaaaaaaaaaaaa', git_dirty = 0");
  CHECK(judge(false).claims[0].verdict == "holds");  // one clean state
  // The two sides from two commits.
  set("UPDATE runs SET git_commit = 'bbbbbbbbbbbbbbbb' WHERE variant = 'slow'");
  const auto mixed = judge(false);
  CHECK(mixed.tests == 0);
  const auto& row = mixed.claims[0].tasks.at(0);
  CHECK(row.verdict == "no verdict");
  CHECK(row.direction.empty());
  CHECK(row.mixed_code == "2 code states: aaaaaaaaaaaa (4 runs); bbbbbbbbbbbb (4 runs)");
  CHECK(row.note ==
        "mixed code: 2 code states: aaaaaaaaaaaa (4 runs); bbbbbbbbbbbb (4 runs); no verdict (chiar report "
        "--allow-mixed-code judges it anyway)");
  const auto allowed = judge(true);
  CHECK(allowed.tests == 1);
  CHECK(allowed.claims[0].tasks.at(0).verdict == "holds");
  CHECK(allowed.claims[0].tasks.at(0).note ==
        "mixed code, judged as --allow-mixed-code asks: 2 code states: aaaaaaaaaaaa (4 runs); bbbbbbbbbbbb (4 runs)");
  // One commit, but a dirty tree; or one commit and two product libraries.
  set("UPDATE runs SET git_commit = 'aaaaaaaaaaaaaaaa'");
  set("UPDATE runs SET git_dirty = 1 WHERE seed = 0");
  CHECK(judge(false).claims[0].tasks.at(0).mixed_code ==
        "2 code states: aaaaaaaaaaaa (6 runs); aaaaaaaaaaaa with uncommitted changes (2 runs)");
  set("UPDATE runs SET git_dirty = 0, gemm = 'onednn: oneDNN 2.6.3 sgemm'");
  CHECK(judge(false).claims[0].verdict == "holds");
  set("UPDATE runs SET gemm = 'blas: OpenBLAS 0.3.21' WHERE variant = 'fast'");
  CHECK(judge(false).claims[0].tasks.at(0).mixed_code ==
        "2 code states: aaaaaaaaaaaa, products on blas (4 runs); aaaaaaaaaaaa, products on onednn (4 runs)");
  // Through the CLI, and the export's commit and clean-tree columns.
  d.write("variants.toml", "[variants.fast]\n[variants.slow]\n");
  const std::string claims = d.write(
      "c.toml",
      "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"c\"\ntext = \"fast beats slow\"\nkind = \"compare\"\n"
      "task = \"lm\"\nvariants = [\"fast\", \"slow\"]\nmetric = \"token_ppl\"\nbetter = \"lower\"\n");
  for (const bool allow : {false, true}) {
    std::vector<std::string> args = {"report", db, "--out", d.path() + "/r/m", "--claims", claims};
    if (allow) args.push_back("--allow-mixed-code");
    const auto out = test::run_chiar(args);
    INFO(out.output);
    REQUIRE(out.status == 0);
    CHECK_THAT(test::read_text(d.path() + "/r/m.md"),
               Catch::Matchers::Contains(allow ? "| **holds** |" : "| **no verdict** |"));
  }
  const auto csv = test::run_chiar({"export", db, "--csv"});
  CHECK_THAT(csv.output, Catch::Matchers::StartsWith("run,status,metric,value,attn_gflops,total_gflops,train_tok_s,"
                                                     "eval_tok_s,params,overhead_%,commit,clean_tree,products\n"));
  CHECK_THAT(csv.output, Catch::Matchers::Contains(",aaaaaaaaaaaaaaaa,true,onednn: oneDNN 2.6.3 sgemm\n"));
  CHECK_THAT(csv.output, Catch::Matchers::Contains(",aaaaaaaaaaaaaaaa,true,blas: OpenBLAS 0.3.21\n"));
  const auto json = test::run_chiar({"export", db, "--json"});
  CHECK_THAT(json.output, Catch::Matchers::Contains("\"commit\": \"aaaaaaaaaaaaaaaa\", \"clean_tree\": true, "
                                                    "\"products\": \"blas: OpenBLAS 0.3.21\"}"));
  // To a file: the same bytes; where it cannot go, the path and the cause.
  REQUIRE(test::run_chiar({"export", db, "--csv", "--out", d.path() + "/e.csv"}).status == 0);
  CHECK(test::read_text(d.path() + "/e.csv") == csv.output);
  // In place, as any file a user names: a link's target, the file's mode kept.
  const std::string target = d.write("target.csv", "");
  ::chmod(target.c_str(), 0600);
  boost::filesystem::create_symlink(target, d.path() + "/link.csv");
  REQUIRE(test::run_chiar({"export", db, "--csv", "--out", d.path() + "/link.csv"}).status == 0);
  CHECK(boost::filesystem::is_symlink(d.path() + "/link.csv"));
  CHECK(test::read_text(target) == csv.output);
  struct stat st {};
  REQUIRE(::stat(target.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  const std::string plain = d.write("plain", "a regular file, not a folder\n");
  const auto under_file = test::run_chiar({"export", db, "--csv", "--out", plain + "/e.csv"});
  CHECK(under_file.status == 3);
  CHECK(under_file.output == "chiar: " + plain + "/e.csv: cannot write the file: Not a directory\n");
  const auto folder = test::run_chiar({"export", db, "--json", "--out", d.path()});
  CHECK(folder.status == 2);
  CHECK(folder.output == "chiar: " + d.path() + ": is a folder; give the path of a file\n");
  const auto full = test::run_chiar({"export", db, "--csv", "--out", "/dev/full"});
  CHECK(full.status == 3);
  CHECK(full.output == "chiar: /dev/full: cannot write the file: No space left on device\n");
  // A folder as the store a command writes (one it reads may be a folder of
  // shard stores).
  const auto store_folder = test::run_chiar({"merge", d.path(), db});
  CHECK(store_folder.status == 2);
  CHECK(store_folder.output == "chiar: " + d.path() + ": is a folder; a store is a file (results/NAME.db)\n");
}
