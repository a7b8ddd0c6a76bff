#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include <boost/filesystem.hpp>

#include "engine/sqlite.h"
#include "engine/store.h"
#include "report/claims.h"
#include "report/equal_time.h"
#include "report/report.h"
#include "report/verdict_stats.h"
#include "support/faults.h"
#include "support/fixtures.h"
#include "support/process.h"
#include "support/temp_dir.h"

using namespace chiar;
using test::TempDir;

namespace {

const std::string kClaims = std::string(CHIAR_SOURCE_DIR) + "/configs/claims.toml";

report::Summary summary_of(const std::string& db) {
  return report::summarize(db, report::OperatorCatalog(test::plugins()));
}

engine::RunSpec spec(const std::string& variant, const std::string& task, int64_t seed) {
  engine::RunSpec r;
  r.matrix = "fixture";
  r.variant = variant;
  r.task = task;
  r.seed = seed;
  r.canonical = variant + task + std::to_string(seed);
  r.hash = "h" + std::to_string(std::hash<std::string>{}(r.canonical) % 1000000007);
  if (task == "wikitext103") r.task_family = "large natural text";
  return r;
}

// A store with known numbers: 3 seeds per variant on an LM task, 2 on a
// classification task, one failed and one diverged run.
std::string make_store(const TempDir& d) {
  const std::string db = d.path() + "/fixture.db";
  engine::Store store(db);
  std::vector<engine::RunSpec> runs;
  for (const char* v : {"baseline", "chiar_dct_attn", "chiar_hard", "chiar_soft"})
    for (int seed = 0; seed < 3; ++seed) runs.push_back(spec(v, "wikitext103", seed));
  for (const char* v : {"baseline", "chiar_dct_attn"})
    for (int seed = 0; seed < 2; ++seed) runs.push_back(spec(v, "listops_flat", seed));
  runs.push_back(spec("chiar_soft", "listops_flat", 0));
  runs.push_back(spec("chiar_hard", "listops_flat", 0));
  store.register_runs(runs);
  engine::Provenance p;
  p.host = "fixture-host";
  p.git_commit = "abc123";
  p.torch_version = "1.13";
  for (const auto& r : runs) {
    store.claim(r, p);
    if (r.task == "listops_flat" && r.variant == "chiar_soft") {
      store.finish(r.hash, engine::RunStatus::Failed, "out of memory", -1, {});
      continue;
    }
    if (r.task == "listops_flat" && r.variant == "chiar_hard") {
      store.finish(r.hash, engine::RunStatus::Diverged, "loss nan at step 7", 7, {});
      continue;
    }
    const double s = static_cast<double>(r.seed);
    engine::RunSummary sum;
    sum.params = 1000;
    sum.train_tokens_per_s = r.variant == "baseline" ? 100 : 150;
    sum.eval_tokens_per_s = 300;
    sum.tau = "{}";
    if (r.task == "wikitext103") {
      // baseline perplexity 60, 62, 64; DCT+Attn 30, 32, 34; hard 40..; soft 50..
      const double base = r.variant == "baseline" ? 60 : r.variant == "chiar_dct_attn" ? 30 : r.variant == "chiar_hard" ? 40 : 50;
      store.add_metrics(r.hash, 10, "test", "best", {{"token_ppl", base + 2 * s}, {"word_ppl", base + 2 * s}, {"bits_per_byte", 1.0}});
      store.add_metrics(r.hash, 10, "test", "last", {{"token_ppl", base + 2 * s + 1}});
    } else {
      store.add_metrics(r.hash, 10, "test", "best",
                        {{"accuracy", r.variant == "baseline" ? 0.9 + 0.02 * s : 0.6}, {"majority_rate", 0.125}});
    }
    // Attention 8 GFLOPs per sequence for the baseline, 3 for DCT+Attn (-62.5%).
    const double attn = r.variant == "baseline" ? 8e9 : 3e9;
    store.add_flops(r.hash, 10, {{1, "attention", 64, attn, attn, 3 * attn, 3 * attn}, {1, "ffn", 64, 2e9, 2e9, 6e9, 6e9}}, 5e9);
    if (r.variant == "chiar_hard") store.add_routing(r.hash, 10, 1, {{"dct", 0.6}, {"rbf", 0.02}, {"attention", 0.38}}, std::vector<int64_t>(20, 1));
    store.finish(r.hash, engine::RunStatus::Done, "", -1, sum);
  }
  return db;
}

}  // namespace

TEST_CASE("report tables: means, standard deviations, 95% CIs, best marks", "[report]") {
  TempDir d("report");
  const auto s = summary_of(make_store(d));
  const auto tables = report::task_tables(s, "baseline");
  REQUIRE(tables.size() == 2);
  const auto& lm = tables[0].second;
  CHECK(tables[0].first == "wikitext103");
  CHECK(lm.header[2] == "token PPL");
  // 60, 62, 64: mean 62, sample std 2, CI t(0.975, 2) * 2 / sqrt(3) = 4.303 * 1.1547 = 4.97.
  CHECK(lm.rows[0][2] == "62.00 ± 2.00 (95% CI ± 4.97)");
  CHECK(lm.rows[1][2] == "32.00 ± 2.00 (95% CI ± 4.97)");
  CHECK(lm.best[1][2]);   // lowest perplexity
  CHECK_FALSE(lm.best[0][2]);
  // Word perplexity equal to token perplexity (a word-level vocabulary): not repeated.
  CHECK(lm.header[3] == "bits/byte");
  CHECK(std::find(lm.header.begin(), lm.header.end(), "word PPL") == lm.header.end());
  CHECK(lm.rows[1][4] == "3.00000");  // attention GFLOPs
  CHECK(lm.rows[1][5] == "-62.5%");
  CHECK(lm.rows[1][8] == "1.50×");
  const auto& cls = tables[1].second;
  CHECK(cls.rows.size() == 2);                    // failed and diverged runs are not averaged in
  CHECK(cls.rows[0][2] == "91.00 ± 1.41");        // 90 and 92: two seeds, no CI
  CHECK(cls.best[0][2]);
  CHECK(cls.header[3] == "majority class %");  // shown beside accuracy, never ranked
  CHECK(cls.rows[0][3] == "12.50");
  CHECK_FALSE((cls.best[0][3] || cls.best[1][3]));
  REQUIRE(s.problems.size() == 2);
  CHECK(s.problems[0]->status == engine::RunStatus::Failed);
  CHECK(s.problems[1]->diverged_step == 7);
  const auto st = report::stat_of({1, 2, 3, 4});
  CHECK(st.mean == Approx(2.5));
  CHECK(st.std == Approx(1.2909944));
  CHECK(st.ci95 == Approx(3.1824463 * 1.2909944 / 2).epsilon(1e-7));  // t(0.975, 3 df)
  // Beyond 30 degrees of freedom too, Student's t and not the normal 1.96.
  std::vector<double> many(32);
  for (size_t i = 0; i < many.size(); ++i) many[i] = static_cast<double>(i % 2);
  const auto wide = report::stat_of(many);
  CHECK(wide.ci95 == Approx(2.0395134 * wide.std / std::sqrt(32.0)).epsilon(1e-7));  // t(0.975, 31 df)
}

TEST_CASE("report tables: word perplexity is shown where it differs from token perplexity", "[report]") {
  TempDir d("report-word-ppl");
  const std::string db = make_store(d);
  // One run of a subword or byte vocabulary: a word spans several tokens.
  engine::Database(db).exec(
      "UPDATE metrics SET value = value * 3 WHERE name = 'word_ppl' AND run_id = (SELECT MIN(run_id) FROM metrics "
      "WHERE name = 'word_ppl')");
  const auto lm = report::task_tables(summary_of(db), "baseline")[0].second;
  REQUIRE(lm.header.size() > 4);
  CHECK(lm.header[2] == "token PPL");
  CHECK(lm.header[3] == "word PPL");
  CHECK(lm.header[4] == "bits/byte");
}

TEST_CASE("report tables: peak GPU memory where runs trained on a GPU", "[report]") {
  TempDir d("report-gpu-memory");
  const std::string db = make_store(d);
  const std::string gpu_column = "peak GPU MiB alloc / reserved";
  {
    const auto cpu_only = report::task_tables(summary_of(db), "baseline")[0].second.header;
    CHECK(std::find(cpu_only.begin(), cpu_only.end(), gpu_column) == cpu_only.end());
  }
  // The language model's baseline on a GPU: 100, 110, 120 MiB allocated, 200 reserved.
  engine::Database(db).exec(
      "UPDATE runs SET peak_gpu_allocated_mb = 100 + 10 * seed, peak_gpu_reserved_mb = 200 "
      "WHERE task = 'wikitext103' AND variant = 'baseline'");
  const auto tables = report::task_tables(summary_of(db), "baseline");
  const auto& lm = tables[0].second;
  const auto column = std::find(lm.header.begin(), lm.header.end(), gpu_column);
  REQUIRE(column != lm.header.end());
  CHECK(column + 1 == lm.header.end() - 1);  // just before "scored"
  const auto c = static_cast<size_t>(column - lm.header.begin());
  CHECK(lm.rows[0][c] == "110 / 200");
  CHECK(lm.rows[1][c].empty());  // DCT+Attn trained on the CPU
  const auto& cls = tables[1].second;
  CHECK(std::find(cls.header.begin(), cls.header.end(), gpu_column) == cls.header.end());
}

TEST_CASE("report provenance: which runs came from which commit; auto's product without its rates", "[report]") {
  TempDir d("report-provenance");
  const std::string db = make_store(d);
  CHECK(summary_of(db).provenance.commits == "abc123");
  {
    engine::Database w(db);
    w.exec("UPDATE runs SET git_commit = 'fedcba9876543210aa', git_dirty = 1, started_at = '2999-01-01T00:00:00Z' "
           "WHERE variant = 'chiar_soft'");
    w.exec("UPDATE runs SET blas = 'libblas.so.3', gemm = 'onednn: oneDNN x; auto: 2048x256x1024 at 121 GFLOP/s on "
           "oneDNN, 66 on the BLAS' WHERE variant = 'baseline'");
    w.exec("UPDATE runs SET blas = 'libblas.so.3', gemm = 'onednn: oneDNN x; auto: 2048x256x1024 at 285 GFLOP/s on "
           "oneDNN, 202 on the BLAS' WHERE variant = 'chiar_dct_attn'");
  }
  const auto p = summary_of(db).provenance;
  // 5 + 5 + 4 runs on abc123 started first; chiar_soft's 4 later, from a dirty tree.
  CHECK(p.commits == "abc123 (14 runs); fedcba987654 with uncommitted changes (4 runs)");
  CHECK(p.gemm == "onednn: oneDNN x (chosen by auto)");
}

TEST_CASE("quality at equal training time: read off each run's learning curve", "[report]") {
  // baseline: 100 ms steps, validations at steps 10, 20, 30 (1, 2, 3 s);
  // fast: 50 ms steps, validations at 20, 40, 80 (1, 2, 4 s). Each run's last
  // validation scores the whole split (5,000 tokens, not 1,000) and is left
  // out of its curve. T* = min(3 s, 4 s) = 3 s, where baseline's curve ends.
  TempDir d("equal-time");
  const std::string db = d.path() + "/equal.db";
  {
    engine::Store store(db);
    std::vector<engine::RunSpec> runs;
    for (const char* v : {"baseline", "fast"})
      for (int seed = 0; seed < 3; ++seed) runs.push_back(spec(v, "lm", seed));
    store.register_runs(runs);
    for (const auto& r : runs) {
      store.claim(r, engine::Provenance{});
      const double s = static_cast<double>(r.seed);
      const bool fast = r.variant == "fast";
      const std::vector<std::pair<int64_t, double>> curve =
          fast ? std::vector<std::pair<int64_t, double>>{{20, 110}, {40, 90}, {80, 70}}
               : std::vector<std::pair<int64_t, double>>{{10, 100}, {20, 80}, {30, 70}};
      for (const auto& [step, ppl] : curve) store.add_metrics(r.hash, step, "valid", "current", {{"token_ppl", ppl + s}, {"tokens", 1000}});
      store.add_metrics(r.hash, fast ? 100 : 40, "valid", "current", {{"token_ppl", 50.0}, {"tokens", 5000}});
      store.add_metrics(r.hash, fast ? 100 : 40, "test", "best", {{"token_ppl", 60.0}});
      engine::RunSummary sum;
      sum.step_ms = fast ? 50 : 100;
      sum.tau = "{}";
      store.finish(r.hash, engine::RunStatus::Done, "", -1, sum);
    }
  }
  const auto tables = report::equal_time_tables(summary_of(db));
  REQUIRE(tables.size() == 1);
  const auto& e = tables[0];
  CHECK(e.task == "lm");
  CHECK(e.seconds == Approx(3.0));
  CHECK(e.limited_by == "baseline");
  CHECK(e.table.header[2] == "valid token PPL at 3.0 s");
  // baseline at 3 s: its last point, 70 + seed; fast at 3 s: halfway from 90 to 70.
  CHECK(e.table.rows[0] == std::vector<std::string>{"baseline", "3", "71.00 ± 1.00", "30", "71.00 ± 1.00", "3.0"});
  CHECK(e.table.rows[1] == std::vector<std::string>{"fast", "3", "81.00 ± 1.00", "60", "71.00 ± 1.00", "4.0"});
  CHECK(e.table.best[0][2]);
  CHECK_FALSE(e.table.best[1][2]);
  // And in the report, under the task's table.
  const auto files = report::write_report(db, d.path() + "/out/equal", "baseline", kClaims, test::plugins());
  const std::string text = test::read_text(files.markdown);
  CHECK_THAT(text, Catch::Matchers::Contains("### lm at equal training time\n\nValidation quality after the same 3.0 s of training, when baseline's curve ends"));
}

TEST_CASE("report claims: verdicts from the numbers", "[report]") {
  TempDir d("claims");
  const std::string db = make_store(d);
  const auto claims = report::evaluate_claims(report::load_claims(kClaims), summary_of(db), "baseline");
  std::map<std::string, std::string> verdict;
  for (const auto& c : claims) verdict[c.claim.substr(0, 20)] = c.verdict;
  CHECK(verdict["WikiText-103: DCT+At"] == "holds");             // 32 < 62 on every seed
  CHECK(verdict["WikiText-2: full att"] == "not enough seeds");  // no such task
  CHECK(verdict["Flat ListOps: full a"] == "not enough seeds");  // 2 seeds a side
  // Exactly -62.5% where 3 seeds ran, but listops_flat has 2: a claim about
  // every task waits for them.
  CHECK(verdict["DCT+Attn cuts attent"] == "not enough seeds");
  CHECK(verdict["Hard (STE) routing b"] == "holds");             // 42 < 52
  CHECK(verdict["Routing collapse: th"] == "holds");             // RBF 2%
  // Seeds 0-2 on both sides: paired; the fixture's differences have no
  // spread, so the interval has no width and there is no effect size.
  // Three comparisons had a test (the 2-seed one had none): Holm over 3.
  CHECK(claims[0].measured ==
        "wikitext103 (family: large natural text): chiar_dct_attn 32.00 vs baseline 62.00 (3 and 3 seeds); "
        "difference -30.00, 95% CI "
        "[-30.00, -30.00], paired by seed, p < 0.001 (Holm, 3 tests), d_z n/a (no spread)");
  CHECK(claims[0].paper == "36.54 vs 66.62");
  CHECK(claims[0].direction == "agrees");
  CHECK(claims[1].measured == "needs baseline and chiar_dct_attn on a task of family 'small dataset'");
  CHECK(claims[3].measured ==
        "listops_flat: baseline 91.00% vs chiar_dct_attn 60.00% (2 and 2 seeds; a verdict needs 3 per side)");
  CHECK(claims[3].direction == "agrees");
  CHECK(claims[4].measured ==
        "wikitext103: -62.5% executed (8.0000 -> 3.0000 GFLOPs per sequence; 3 and 3 seeds), -62.5% for a sparse "
        "execution; listops_flat: -62.5% executed (8.0000 -> 3.0000 GFLOPs per sequence; 2 and 2 seeds; a verdict "
        "needs 3 per side)");
  CHECK(claims[6].verdict == "holds");  // 32 < 42 on the one task both finished
  // The reduction about the task with 3 seeds alone holds.
  auto cut = report::load_claims(kClaims)[4];
  REQUIRE(cut.kind == "reduction");
  cut.task = "wikitext103";
  cut.family.clear();
  CHECK(report::evaluate_claim(cut, summary_of(db), "baseline").verdict == "holds");
  CHECK(claims[7].measured ==
        "mean RBF share in routed layers at the end of training: 2.0% over 3 runs, 95% CI [2.0%, 2.0%] against the "
        "claim's 10.0%");
  // --baseline moves every "$baseline" of the file.
  const auto other = report::evaluate_claims(report::load_claims(kClaims), summary_of(db), "chiar_soft");
  CHECK(other[0].measured.rfind(
            "wikitext103 (family: large natural text): chiar_dct_attn 32.00 vs chiar_soft 52.00 (3 and 3 seeds)", 0) == 0);
}

TEST_CASE("report claims: runs left out are named, pairs are the seeds both finished; a claim over several tasks "
          "needs all of them", "[report]") {
  // Perplexity 10 + seed for a (seeds 0-2), 20 + seed for b (0-2; seed 3
  // diverged), 15 + seed for c (0-3), 30 + seed for d (10-12) on lm; lm2 has
  // a and b with 2 seeds each.
  TempDir d("claims-left-out");
  const std::string db = d.path() + "/left.db";
  {
    engine::Store store(db);
    std::vector<engine::RunSpec> runs;
    for (const char* v : {"a", "b"})
      for (int seed = 0; seed < 3; ++seed) runs.push_back(spec(v, "lm", seed));
    runs.push_back(spec("b", "lm", 3));
    for (int seed = 0; seed < 4; ++seed) runs.push_back(spec("c", "lm", seed));
    for (int seed = 10; seed < 13; ++seed) runs.push_back(spec("d", "lm", seed));
    for (const char* v : {"a", "b"})
      for (int seed = 0; seed < 2; ++seed) runs.push_back(spec(v, "lm2", seed));
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
  CHECK(one.verdict == "holds");
  CHECK(one.measured ==
        "lm: a 11.00 vs b 21.00 (3 and 3 seeds; left out: b 1 diverged); difference -10.00, 95% CI [-10.00, -10.00], "
        "paired by seed, p < 0.001, d_z n/a (no spread)");
  // c's seed 3 has no partner: the pairs are seeds 0-2, each 5 apart.
  c.variants = {"c", "b"};
  CHECK(report::evaluate_claim(c, summary_of(db), "a").measured ==
        "lm: c 16.50 vs b 21.00 (4 and 3 seeds; left out: b 1 diverged); difference -5.00, 95% CI [-5.00, -5.00], "
        "paired by seed over the 3 both finished, p < 0.001, d_z n/a (no spread)");
  // No seed in common: Welch's t, df 4 (t 2.776445), Hedges' g = 30 x (1 - 3/15).
  c.variants = {"d", "a"};
  const auto welch = report::evaluate_claim(c, summary_of(db), "a");
  CHECK(welch.verdict == "does not hold");
  CHECK(welch.measured ==
        "lm: d 41.00 vs a 11.00 (3 and 3 seeds); difference +30.00, 95% CI [+27.73, +32.27], Welch's t, "
        "p < 0.001, g = +24.00");
  c.variants = {"a", "b"};
  c.task = "lm*";
  const auto both = report::evaluate_claim(c, summary_of(db), "a");
  CHECK(both.comparisons.size() == 2);
  CHECK(both.verdict == "not enough seeds");
}

TEST_CASE("verdict statistics: paired and Welch intervals, p-values, effect sizes, Holm", "[report]") {
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
}

namespace {

// A store of one LM task whose variants have the given test perplexity per seed.
std::string verdict_store(const TempDir& d, const std::string& name,
                          const std::map<std::string, std::vector<double>>& ppl) {
  const std::string db = d.path() + "/" + name;
  engine::Store store(db);
  std::vector<engine::RunSpec> runs;
  for (const auto& [variant, values] : ppl)
    for (size_t seed = 0; seed < values.size(); ++seed) runs.push_back(spec(variant, "lm", static_cast<int64_t>(seed)));
  store.register_runs(runs);
  for (const auto& r : runs) {
    store.claim(r, engine::Provenance{});
    store.add_metrics(r.hash, 10, "test", "best", {{"token_ppl", ppl.at(r.variant)[static_cast<size_t>(r.seed)]}});
    store.finish(r.hash, engine::RunStatus::Done, "", -1, {});
  }
  return db;
}

// A claims file with one compare claim "a beats b" on perplexity.
std::string claim_file(const TempDir& d, const std::string& a, const std::string& b) {
  d.write("variants.toml", "[variants.fast]\n[variants.slow]\n[variants.fast_again]\n[variants.few]\n");
  return d.write("mine.toml", "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"mine\"\ntext = \"" + a +
                                  " beats " + b + "\"\nkind = \"compare\"\ntask = \"lm\"\nvariants = [\"" + a +
                                  "\", \"" + b + "\"]\nmetric = \"token_ppl\"\nbetter = \"lower\"\npaper = [10, 20]\n");
}

report::Claim judge(const TempDir& d, const std::string& db, const std::string& a, const std::string& b) {
  return report::evaluate_claims(report::load_claims(claim_file(d, a, b)), summary_of(db), "slow").front();
}

}  // namespace

// Finished runs of variant "hard" whose routed layer ends with the given RBF shares.
std::string share_store(const TempDir& d, const std::string& name, const std::vector<double>& rbf) {
  const std::string db = d.path() + "/" + name;
  engine::Store store(db);
  std::vector<engine::RunSpec> runs;
  for (size_t seed = 0; seed < rbf.size(); ++seed) runs.push_back(spec("hard", "lm", static_cast<int64_t>(seed)));
  store.register_runs(runs);
  for (size_t i = 0; i < runs.size(); ++i) {
    store.claim(runs[i], engine::Provenance{});
    store.add_routing(runs[i].hash, 10, 1, {{"dct", 0.5}, {"rbf", rbf[i]}, {"attention", 0.5 - rbf[i]}},
                      std::vector<int64_t>(20, 1));
    store.finish(runs[i].hash, engine::RunStatus::Done, "", -1, {});
  }
  return db;
}

TEST_CASE("share claims: judged by the runs' 95% interval against the threshold", "[report]") {
  TempDir d("share-claims");
  d.write("variants.toml", "[variants.hard]\n");
  const std::string file = d.write(
      "share.toml", "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"collapse\"\ntext = \"hard rejects RBF\"\n"
                    "kind = \"share\"\ntask = \"*\"\nvariants = [\"hard\"]\nmetric = \"share\"\nbetter = \"lower\"\n"
                    "operator = \"rbf\"\nthreshold = 0.10\n");
  auto judge_share = [&](const std::string& name, const std::vector<double>& rbf) {
    return report::evaluate_claims(report::load_claims(file), summary_of(share_store(d, name, rbf)), "hard").front();
  };
  // Mean 3%, sd 1%: t(2) 4.303 x 1% / sqrt 3 = 2.48% either side, wholly below 10%.
  const auto low = judge_share("low.db", {0.02, 0.03, 0.04});
  CHECK(low.verdict == "holds");
  CHECK(low.measured ==
        "mean RBF share in routed layers at the end of training: 3.0% over 3 runs, 95% CI [0.5%, 5.5%] against the "
        "claim's 10.0%");
  // Mean 9% below the threshold, but sd 4% gives [-0.9%, 18.9%]: a mean is not a verdict.
  const auto spread = judge_share("spread.db", {0.05, 0.09, 0.13});
  CHECK(spread.verdict == "inconclusive");
  CHECK_THAT(spread.measured, Catch::Matchers::EndsWith("9.0% over 3 runs, 95% CI [-0.9%, 18.9%] against the claim's 10.0%"));
  CHECK(judge_share("high.db", {0.30, 0.31, 0.32}).verdict == "does not hold");
  CHECK(judge_share("two.db", {0.01, 0.01}).verdict == "not enough seeds");
}

TEST_CASE("claim verdicts: a real difference, the same variant twice, too few seeds", "[report]") {
  TempDir d("verdicts");
  const std::string db = verdict_store(d, "v.db", {{"fast", {30.1, 31.5, 29.8, 30.6}},
                                                   {"slow", {35.2, 36.9, 34.1, 35.5}},
                                                   {"fast_again", {30.1, 31.5, 29.8, 30.6}},
                                                   {"few", {20.0, 21.0}}});
  const auto real = judge(d, db, "fast", "slow");
  CHECK(real.verdict == "holds");
  CHECK(real.direction == "agrees");
  REQUIRE(real.comparisons.size() == 1);
  CHECK(real.comparisons[0].test->paired);
  CHECK(real.comparisons[0].test->hi < 0);
  const auto reverse = judge(d, db, "slow", "fast");
  CHECK(reverse.verdict == "does not hold");
  CHECK(reverse.direction == "disagrees");
  // The same results under two names: the interval is [0, 0].
  const auto twice = judge(d, db, "fast", "fast_again");
  CHECK(twice.verdict == "inconclusive");
  CHECK(twice.measured ==
        "lm: fast 30.50 vs fast_again 30.50 (4 and 4 seeds); difference +0.00, 95% CI [+0.00, +0.00], paired by "
        "seed, p = 1.000, d_z n/a (no spread)");
  const auto few = judge(d, db, "few", "slow");
  CHECK(few.verdict == "not enough seeds");
  CHECK(few.comparisons[0].n_a == 2);
  CHECK_FALSE(few.comparisons[0].test.has_value());
  // Seeds 0-2 against 0-3: paired over the three both finished (slow's seed
  // 3 has no partner); seeds with nothing in common get Welch's t ("report
  // claims: runs left out are named...").
  const std::string shifted = verdict_store(d, "w.db", {{"fast", {30.1, 31.5, 29.8}}, {"slow", {35.2, 36.9, 34.1, 35.5}}});
  const auto partial = judge(d, shifted, "fast", "slow");
  REQUIRE(partial.comparisons[0].test.has_value());
  CHECK(partial.comparisons[0].test->paired);
  CHECK(partial.comparisons[0].test->n_a == 3);
  CHECK_THAT(partial.measured, Catch::Matchers::Contains("(3 and 4 seeds); difference -4.93, 95% CI [-6.35, -3.52], "
                                                         "paired by seed over the 3 both finished"));
  // A noisy difference whose interval contains zero is inconclusive, not "holds".
  const std::string noisy = verdict_store(d, "n.db", {{"fast", {30, 40, 35}}, {"slow", {36, 31, 38}}});
  CHECK(judge(d, noisy, "fast", "slow").verdict == "inconclusive");
}

TEST_CASE("claims about a task family are tested on the tasks of that family", "[report]") {
  TempDir d("family");
  const std::string db = d.path() + "/f.db";
  {
    engine::Store store(db);
    std::vector<engine::RunSpec> runs;
    for (const char* v : {"fast", "slow"})
      for (int64_t seed = 0; seed < 3; ++seed) {
        runs.push_back(spec(v, "corpus_small", seed));
        runs.back().task_family = "large natural text";
        runs.push_back(spec(v, "other", seed));  // no family: not what the claim is about
      }
    store.register_runs(runs);
    for (const auto& r : runs) {
      store.claim(r, engine::Provenance{});
      const double ppl = (r.variant == std::string("fast") ? 30 : 40) + static_cast<double>(r.seed) +
                         (r.task == "other" ? 100 : 0);
      store.add_metrics(r.hash, 10, "test", "best", {{"token_ppl", ppl}});
      store.finish(r.hash, engine::RunStatus::Done, "", -1, {});
    }
  }
  d.write("variants.toml", "[variants.fast]\n[variants.slow]\n");
  const std::string file = d.write(
      "family.toml", "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"big\"\ntext = \"fast beats slow on big text\"\n"
                     "kind = \"compare\"\nfamily = \"large natural text\"\nvariants = [\"fast\", \"slow\"]\n"
                     "metric = \"token_ppl\"\nbetter = \"lower\"\n");
  const auto claims = report::evaluate_claims(report::load_claims(file), summary_of(db), "slow");
  REQUIRE(claims[0].comparisons.size() == 1);
  CHECK(claims[0].comparisons[0].task == "corpus_small (family: large natural text)");
  CHECK(claims[0].verdict == "holds");
  CHECK_THAT(claims[0].measured, Catch::Matchers::StartsWith("corpus_small (family: large natural text): fast 31.00 vs slow 41.00"));
  // A claim names a task or a family, not both.
  const std::string both = d.write(
      "both.toml", "include = [\"variants.toml\"]\n\n[[claims]]\nid = \"big\"\ntext = \"x\"\nkind = \"compare\"\n"
                   "task = \"other\"\nfamily = \"large natural text\"\nvariants = [\"fast\", \"slow\"]\n"
                   "metric = \"token_ppl\"\nbetter = \"lower\"\n");
  CHECK_THROWS_WITH(report::load_claims(both),
                    both + ":8:10: key 'claims[0].family': a claim names a task or a family, not both");
}

TEST_CASE("chiar report --claims: a user's claim end to end", "[report]") {
  TempDir d("user-claims");
  const std::string db = verdict_store(d, "u.db", {{"fast", {30.1, 31.5, 29.8, 30.6}}, {"slow", {35.2, 36.9, 34.1, 35.5}}});
  const std::string claims = claim_file(d, "fast", "slow");
  const auto out = test::run_chiar({"report", db, "--out", d.path() + "/r/u", "--baseline", "slow", "--claims", claims});
  INFO(out.output);
  REQUIRE(out.status == 0);
  std::ifstream md(d.path() + "/r/u.md");
  const std::string text((std::istreambuf_iterator<char>(md)), {});
  CHECK_THAT(text, Catch::Matchers::Contains("1 comparison was tested; the p-values shown are Holm-adjusted"));
  CHECK_THAT(text, Catch::Matchers::Contains("| fast beats slow | 10 vs 20 | lm: fast 30.50 vs slow 35.42 (4 and 4 seeds); "
                                             "difference -4.92, 95% CI ["));
  CHECK_THAT(text, Catch::Matchers::Contains(" | agrees | holds |"));
  // A baseline named on the command line must be one of the store's variants.
  const auto misnamed = test::run_chiar({"report", db, "--out", d.path() + "/r/v", "--baseline", "slwo", "--claims", claims});
  CHECK(misnamed.status == 2);
  CHECK(misnamed.output == "chiar: --baseline: " + db + " holds no run of variant 'slwo' (did you mean 'slow'?)\n");
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/r/v.md"));
}

TEST_CASE("report files: Markdown with charts beside it, HTML that renders offline", "[report][html]") {
  TempDir d("report-files");
  const std::string db = make_store(d);
  const auto files = report::write_report(db, d.path() + "/out/fixture", "baseline", kClaims, test::plugins());
  CHECK(boost::filesystem::exists(files.markdown));
  CHECK(files.images.size() >= 4);
  for (const auto& image : files.images) CHECK(boost::filesystem::file_size(image) > 500);
  std::ifstream md(files.markdown);
  const std::string text((std::istreambuf_iterator<char>(md)), {});
  CHECK_THAT(text, Catch::Matchers::Contains("| chiar_hard/listops_flat/seed=0 | diverged | diverged at step 7: loss nan at step 7 |"));
  CHECK_THAT(text, Catch::Matchers::Contains("](fixture-pareto-wikitext103.svg)"));
  CHECK_THAT(text, Catch::Matchers::Contains("Provenance: harness commit abc123"));
  std::ifstream html_in(files.html);
  const std::string html((std::istreambuf_iterator<char>(html_in)), {});
  CHECK(html.find("http://") == html.find("http://www.w3.org"));  // only SVG namespaces, no fetches
  CHECK(html.find("<script") == std::string::npos);

  // Headless Chromium: the page renders, every chart is in the DOM, no console errors.
  const std::string profile = d.path() + "/chromium-profile";
  const std::string shot = std::string(CHIAR_BINARY_DIR) + "/test-artifacts/report.png";
  boost::filesystem::create_directories(boost::filesystem::path(shot).parent_path());
  const std::string flags = "--headless --no-sandbox --disable-gpu --user-data-dir=" + profile +
                            " --enable-logging=stderr --v=0 --window-size=1280,6000 ";
  auto capture = [](const std::string& cmd) {
    std::string out;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    std::array<char, 4096> buf{};
    while (p && fgets(buf.data(), buf.size(), p)) out += buf.data();
    if (p) pclose(p);
    return out;
  };
  const std::string dom = capture("chromium " + flags + "--dump-dom file://" + files.html);
  size_t svgs = 0;
  for (size_t at = dom.find("<svg"); at != std::string::npos; at = dom.find("<svg", at + 1)) ++svgs;
  CHECK(svgs == files.images.size());
  CHECK(dom.find("CONSOLE") == std::string::npos);
  CHECK(dom.find("Uncaught") == std::string::npos);
  capture("chromium " + flags + "--screenshot=" + shot + " file://" + files.html);
  CHECK(boost::filesystem::exists(shot));
}
