#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <string>

#include <boost/filesystem.hpp>

#include "engine/runner.h"
#include "engine/store/results.h"
#include "engine/store/sqlite.h"
#include "engine/store/store.h"
#include "report/claims.h"
#include "report/equal_time.h"
#include "report/report.h"
#include "report/verdict_stats.h"
#include "support/faults.h"
#include "support/fixtures.h"
#include "support/process.h"
#include "support/synthetic_store.h"
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
    sum.train_seconds = 360;
    sum.tau = "{}";
    if (r.task == "wikitext103") {
      // baseline perplexity 60, 62, 64; DCT+Attn 30, 32, 34; hard 40..; soft 50..
      const double base = r.variant == "baseline"         ? 60
                          : r.variant == "chiar_dct_attn" ? 30
                          : r.variant == "chiar_hard"     ? 40
                                                          : 50;
      store.add_metrics(r.hash, 10, "test", "best",
                        {{"token_ppl", base + 2 * s}, {"word_ppl", base + 2 * s}, {"bits_per_byte", 1.0}});
      store.add_metrics(r.hash, 10, "test", "last", {{"token_ppl", base + 2 * s + 1}});
    } else {
      store.add_metrics(r.hash, 10, "test", "best",
                        {{"accuracy", r.variant == "baseline" ? 0.9 + 0.02 * s : 0.6}, {"majority_rate", 0.125}});
    }
    // Attention 8 GFLOPs per sequence for the baseline, 3 for DCT+Attn (-62.5%).
    const double attn = r.variant == "baseline" ? 8e9 : 3e9;
    store.add_flops(r.hash, 10,
                    {{1, "attention", 64, attn, attn, 3 * attn, 3 * attn, true}, {1, "ffn", 64, 2e9, 2e9, 6e9, 6e9}},
                    5e9);
    if (r.variant == "chiar_hard")
      store.add_routing(r.hash, 10, 1, {{"dct", 0.6}, {"rbf", 0.02}, {"attention", 0.38}}, std::vector<int64_t>(20, 1));
    store.finish(r.hash, engine::RunStatus::Done, "", -1, sum);
  }
  return db;
}

// A store of three seeds each of `baseline` and `fast` on the LM task `lm`:
// `record` writes a claimed run's metrics and returns its summary;
// `machine`, when given, says what each run was claimed on.
std::string make_lm_store(const TempDir& d, const std::string& name,
                          const std::function<engine::RunSummary(engine::Store&, const engine::RunSpec&)>& record,
                          const std::function<engine::Provenance(const engine::RunSpec&)>& machine = {}) {
  const std::string db = d.path() + "/" + name + ".db";
  engine::Store store(db);
  std::vector<engine::RunSpec> runs;
  for (const char* v : {"baseline", "fast"})
    for (int seed = 0; seed < 3; ++seed) runs.push_back(spec(v, "lm", seed));
  store.register_runs(runs);
  for (const auto& r : runs) {
    store.claim(r, machine ? machine(r) : engine::Provenance{});
    engine::RunSummary sum = record(store, r);
    sum.tau = "{}";
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
  CHECK(lm.best[1][2]);  // lowest perplexity
  CHECK_FALSE(lm.best[0][2]);
  // Word perplexity equal to token perplexity (a word-level vocabulary): not repeated.
  CHECK(lm.header[3] == "bits/byte");
  CHECK(std::find(lm.header.begin(), lm.header.end(), "word PPL") == lm.header.end());
  CHECK(lm.rows[1][4] == "3.00000");  // attention GFLOPs
  CHECK(lm.rows[1][5] == "-62.5%");
  CHECK(lm.rows[1][8] == "1.50×");
  const auto& cls = tables[1].second;
  CHECK(cls.rows.size() == 2);              // failed and diverged runs are not averaged in
  CHECK(cls.rows[0][2] == "91.00 ± 1.41");  // 90 and 92: two seeds, no CI
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
    w.exec(
        "UPDATE runs SET git_commit = 'fedcba9876543210aa', git_dirty = 1, started_at = '2999-01-01T00:00:00Z' "
        "WHERE variant = 'chiar_soft'");
    w.exec(
        "UPDATE runs SET blas = 'libblas.so.3', gemm = 'onednn: oneDNN x; auto: 2048x256x1024 at 121 GFLOP/s on "
        "oneDNN, 66 on the BLAS' WHERE variant = 'baseline'");
    w.exec(
        "UPDATE runs SET blas = 'libblas.so.3', gemm = 'onednn: oneDNN x; auto: 2048x256x1024 at 285 GFLOP/s on "
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
  const std::string db = make_lm_store(d, "equal", [](engine::Store& store, const engine::RunSpec& r) {
    const double s = static_cast<double>(r.seed);
    const bool fast = r.variant == "fast";
    const std::vector<std::pair<int64_t, double>> curve =
        fast ? std::vector<std::pair<int64_t, double>>{{20, 110}, {40, 90}, {80, 70}}
             : std::vector<std::pair<int64_t, double>>{{10, 100}, {20, 80}, {30, 70}};
    for (const auto& [step, ppl] : curve)
      store.add_metrics(r.hash, step, "valid", "current", {{"token_ppl", ppl + s}, {"tokens", 1000}});
    store.add_metrics(r.hash, fast ? 100 : 40, "valid", "current", {{"token_ppl", 50.0}, {"tokens", 5000}});
    store.add_metrics(r.hash, fast ? 100 : 40, "test", "best", {{"token_ppl", 60.0}});
    engine::RunSummary sum;
    sum.step_ms = fast ? 50 : 100;
    return sum;
  });
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
  CHECK_THAT(text, Catch::Matchers::Contains("### lm at equal training time\n\nValidation quality after the same 3.0 s "
                                             "of training, when baseline's curve ends"));
}

TEST_CASE("report speeds: a run timed under other load is named and left out of speeds, not of metrics", "[report]") {
  // baseline's seed 2 took 5x the step time of seed 0 (another job shared the
  // cores) and scored the test split 10x slower; fast's seed 1 trained at
  // its siblings' speed but scored 3x slower. Every perplexity counts.
  TempDir d("disturbed");
  const std::string db = make_lm_store(d, "disturbed", [](engine::Store& store, const engine::RunSpec& r) {
    const bool fast = r.variant == "fast", slowed = !fast && r.seed == 2;
    for (int64_t step : {10, 20, 30})
      store.add_metrics(r.hash, step, "valid", "current",
                        {{"token_ppl", 100.0 - static_cast<double>(step) + (fast ? 10 : 0)}, {"tokens", 1000}});
    store.add_metrics(r.hash, 30, "test", "best", {{"token_ppl", 70.0 + static_cast<double>(r.seed)}});
    engine::RunSummary sum;
    sum.step_ms = fast ? 50 : slowed ? 500 : r.seed == 0 ? 100 : 120;
    sum.train_tokens_per_s = fast ? 2000 : slowed ? 200 : 1000;
    sum.eval_tokens_per_s = slowed || (fast && r.seed == 1) ? (fast ? 1000 : 300) : 3000;
    return sum;
  });
  const auto s = summary_of(db);
  REQUIRE(s.tasks.size() == 1);
  const auto& base = s.tasks[0].variants[0];
  const auto& fast = s.tasks[0].variants[1];
  REQUIRE(base.disturbed.size() == 1);
  CHECK(base.disturbed[0]->seed == 2);
  CHECK(base.metric.at("token_ppl").mean == Approx(71.0));  // 70, 71, 72: every seed
  CHECK(base.train_tps.n == 2);
  CHECK(base.train_tps.mean == Approx(1000));
  CHECK(base.eval_tps.n == 2);
  CHECK(base.eval_tps.mean == Approx(3000));
  CHECK(base.step_ms == Approx(110));  // the median of 100 and 120
  CHECK(fast.disturbed.empty());
  REQUIRE(fast.disturbed_eval.size() == 1);
  CHECK(fast.disturbed_eval[0]->seed == 1);
  CHECK(fast.train_tps.n == 3);
  CHECK(fast.eval_tps.n == 2);
  const auto tables = report::task_tables(s, "baseline");
  CHECK(tables[0].second.header[8] == "speed-up");
  CHECK(tables[0].second.rows[1][8] == "2.00×");  // 2000 / 1000, not 2000 / 733
  // At equal time every baseline run keeps its variant's 110 ms clock: its
  // curve ends at 3.3 s, fast's at 1.5 s (T*), where baseline reads
  // 90 - 10 * 0.4 / 1.1 (between 90 at 1.1 s and 80 at 2.2 s).
  const auto equal = report::equal_time_tables(s);
  REQUIRE(equal.size() == 1);
  CHECK(equal[0].seconds == Approx(1.5));
  CHECK(equal[0].limited_by == "fast");
  CHECK(equal[0].table.rows[0] ==
        std::vector<std::string>{"baseline", "3", "86.36 ± 0.00", "14", "70.00 ± 0.00", "3.3"});
  const auto files = report::write_report(db, d.path() + "/out/disturbed", "baseline", kClaims, test::plugins());
  const std::string note =
      "Training speeds leave out 1 run whose median step time was over 2× that of the fastest seed of the same "
      "variant on this task, most likely because other work shared the machine: baseline seed 2 (5.0×). Evaluation "
      "speeds leave out 2 runs whose test scoring ran over 2× slower than the fastest seed's of the same variant: "
      "baseline seed 2 (10.0×), fast seed 1 (3.0×). Test metrics count every run.";
  CHECK_THAT(test::read_text(files.markdown), Catch::Matchers::Contains(note));
  CHECK_THAT(test::read_text(files.html), Catch::Matchers::Contains(note));
}

TEST_CASE("report speeds: runs timed on other hardware are named and left out of speeds, not of metrics", "[report]") {
  // A store filled over two sittings on two machines: baseline's seed 2 and
  // fast's seed 2 ran on a CPU with wider vector units, 2.5x as fast. Within
  // the machine most runs used, nothing was disturbed; compared across the
  // two, baseline's seeds 0 and 1 would look slowed by other load.
  TempDir d("machines");
  const auto second_sitting = [](const engine::RunSpec& r) { return r.seed == 2; };
  const std::string db = make_lm_store(
      d, "machines",
      [&](engine::Store& store, const engine::RunSpec& r) {
        const bool fast = r.variant == "fast";
        for (int64_t step : {10, 20, 30})
          store.add_metrics(r.hash, step, "valid", "current", {{"token_ppl", 100.0 - static_cast<double>(step)}});
        store.add_metrics(r.hash, 30, "test", "best", {{"token_ppl", 70.0 + static_cast<double>(r.seed)}});
        engine::RunSummary sum;
        const double scale = second_sitting(r) ? 2.5 : 1.0;
        sum.step_ms = (fast ? 50 : r.seed == 0 ? 100 : 120) / scale;
        sum.train_tokens_per_s = (fast ? 2000 : 1000) * scale;
        sum.eval_tokens_per_s = 3000 * scale;
        return sum;
      },
      [&](const engine::RunSpec& r) {
        engine::Provenance p;
        p.device = "cpu";
        p.cpu = "AMD EPYC";
        p.threads = 2;
        p.gemm = second_sitting(r) ? "onednn: oneDNN 2.6.3 sgemm, ISA avx512_core_bf16"
                                   : "onednn: oneDNN 2.6.3 sgemm, ISA avx2";
        return p;
      });
  const auto s = summary_of(db);
  CHECK(s.timing_setup == "cpu, AMD EPYC, 2 threads, 1 process, onednn: oneDNN 2.6.3 sgemm, ISA avx2");
  CHECK(s.runs_on_timing_setup == 4);
  CHECK(s.provenance.finished_runs == 6);
  REQUIRE(s.tasks.size() == 1);
  const auto& base = s.tasks[0].variants[0];
  const auto& fast = s.tasks[0].variants[1];
  for (const auto* v : {&base, &fast}) {
    REQUIRE(v->other_setup.size() == 1);
    CHECK(v->other_setup[0]->seed == 2);
    CHECK(v->disturbed.empty());
    CHECK(v->disturbed_eval.empty());
    CHECK(v->train_tps.n == 2);
    CHECK(v->eval_tps.mean == Approx(3000));
    CHECK(v->metric.at("token_ppl").n == 3);  // 70, 71, 72: every seed
  }
  CHECK(base.train_tps.mean == Approx(1000));
  CHECK(base.step_ms == Approx(110));  // the median of 100 and 120, not of 40, 100 and 120
  CHECK(base.fastest_step_ms == Approx(100));
  const auto tables = report::task_tables(s, "baseline");
  CHECK(tables[0].second.rows[1][8] == "2.00×");
  const auto files = report::write_report(db, d.path() + "/out/machines", "baseline", kClaims, test::plugins());
  const std::string note =
      "Speeds leave out 2 runs timed on other hardware than the rest: baseline seed 2, fast seed 2 (cpu, AMD EPYC, "
      "2 threads, 1 process, onednn: oneDNN 2.6.3 sgemm, ISA avx512_core_bf16). Test metrics count every run.";
  const std::string footer =
      "speeds timed on cpu, AMD EPYC, 2 threads, 1 process, onednn: oneDNN 2.6.3 sgemm, ISA avx2 (4 of 6 finished "
      "runs)";
  for (const auto& file : {files.markdown, files.html}) {
    CHECK_THAT(test::read_text(file), Catch::Matchers::Contains(note));
    CHECK_THAT(test::read_text(file), Catch::Matchers::Contains(footer));
  }
  // fast's other two seeds on a third setup: three setups of 2 runs each,
  // the tie goes to the first in run order (baseline's seed 0), and fast,
  // with no run timed there, has no speed at all: blank cells, not 0.
  engine::Database(db).exec("UPDATE runs SET gemm = 'blas: OpenBLAS 0.3.21' WHERE variant = 'fast' AND seed < 2");
  const auto tied = summary_of(db);
  CHECK(tied.timing_setup == s.timing_setup);
  CHECK(tied.runs_on_timing_setup == 2);
  const auto& unclocked = tied.tasks[0].variants[1];
  CHECK(unclocked.other_setup.size() == 3);
  CHECK(unclocked.train_tps.n == 0);
  CHECK(unclocked.step_ms == 0);
  const auto row = report::task_tables(tied, "baseline")[0].second.rows[1];
  CHECK(row[7] == "");  // train tok/s
  CHECK(row[8] == "");  // speed-up
  CHECK(row[9] == "");  // eval tok/s
}

TEST_CASE("report claims: the paper's claims on the fixture; no task dropped, no verdict from identical seeds",
          "[report][claims]") {
  // Every difference of the fixture is the same on every seed (60 + 2 seed
  // against 30 + 2 seed), and listops_flat has 2 seeds a side.
  TempDir d("claims");
  const std::string db = make_store(d);
  const auto table = report::evaluate_claims(report::load_claims(kClaims), summary_of(db), "baseline");
  const auto& claims = table.claims;
  REQUIRE(claims.size() == 8);
  CHECK(table.tests == 0);
  REQUIRE(claims[0].tasks.size() == 1);
  const auto& wiki = claims[0].tasks[0];
  CHECK(wiki.label == "wikitext103 (family: large natural text)");
  CHECK(wiki.no_spread);
  CHECK(std::isnan(wiki.p_adjusted));
  CHECK(wiki.verdict == "inconclusive");
  CHECK(wiki.direction == "undecided");
  CHECK(wiki.measured ==
        "chiar_dct_attn 32.00 vs baseline 62.00 (3 and 3 seeds); difference -30.00, identical "
        "across seeds, paired by seed, no p-value");
  CHECK(claims[0].verdict == "inconclusive");
  CHECK(claims[0].paper == "36.54 vs 66.62");
  CHECK(claims[1].tasks.empty());
  CHECK(claims[1].verdict == "not enough seeds");
  CHECK(claims[1].measured == "needs baseline and chiar_dct_attn on a task of family 'small dataset'");
  CHECK(claims[3].verdict == "not enough seeds");
  CHECK(claims[3].tasks.at(0).measured ==
        "baseline 91.00% vs chiar_dct_attn 60.00% (2 and 2 seeds; a verdict needs 3 per side)");
  CHECK(claims[3].detail == "lacking on listops_flat (2 and 2 seeds; a verdict needs 3 per side)");
  // FLOP counts are exact: the cut on wikitext103 holds without a spread,
  // and listops_flat, with 2 seeds, keeps the claim from a verdict.
  REQUIRE(claims[4].tasks.size() == 2);
  CHECK(claims[4].tasks[0].verdict == "holds");
  CHECK(claims[4].tasks[0].measured ==
        "-62.5% executed (8.0000 -> 3.0000 GFLOPs per sequence; 3 and 3 seeds), the same on every seed against the "
        "claim's -62.5 ± 5.0%; -62.5% for a sparse execution");
  CHECK(claims[4].tasks[1].verdict == "not enough seeds");
  CHECK(claims[4].verdict == "not enough seeds");
  // A task where neither variant finished stays in the claim, named.
  REQUIRE(claims[5].tasks.size() == 2);
  CHECK(claims[5].tasks[1].left_out == "chiar_hard 1 diverged; chiar_soft 1 failed");
  CHECK(claims[5].verdict == "not enough seeds");
  CHECK(claims[5].detail == "lacking on listops_flat (chiar_hard and chiar_soft have no finished run)");
  CHECK(claims[7].tasks.at(0).measured == "RBF share 2.0% (3 runs), identical across seeds against the claim's 10.0%");
  CHECK(claims[7].tasks.at(1).missing == "chiar_hard has no finished run with routing records");
  // --baseline moves every "$baseline" of the file.
  const auto other = report::evaluate_claims(report::load_claims(kClaims), summary_of(db), "chiar_soft");
  CHECK(other.claims[0].tasks.at(0).measured.rfind("chiar_dct_attn 32.00 vs chiar_soft 52.00 (3 and 3 seeds)", 0) == 0);
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
  CHECK_THAT(text, Catch::Matchers::Contains(
                       "| chiar_hard/listops_flat/seed=0 | diverged | diverged at step 7: loss nan at step 7 |"));
  CHECK_THAT(text, Catch::Matchers::Contains("](fixture-pareto-wikitext103.svg)"));
  CHECK_THAT(text, Catch::Matchers::Contains("Provenance: harness commit abc123"));
  // 16 finished runs of 6 minutes; the failed and the diverged run do not count.
  CHECK_THAT(text, Catch::Matchers::Contains("; 1.60 h of training over 16 finished runs (each run's training loop"));
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

TEST_CASE("results: attn_gflops sums the FLOP rows flagged as attention, at each run's last record", "[report]") {
  // Synthetic runs: the baseline (attention in every layer) and
  // chiar_dct_attn (dct, routed attention|dct, attention), one seed; each
  // FLOP row flags its operator as the in-tree traits do (attention only).
  TempDir d("results-attention");
  const std::string db = d.path() + "/s.db";
  test::SyntheticStoreShape shape;
  shape.runs = 8;
  shape.seeds = 1;
  shape.steps = 200;
  shape.eval_every = 100;
  test::write_synthetic_store(db, shape);
  const auto gflops_of = [&](const std::string& where) {
    std::map<std::string, double> out;
    engine::Database con(db, engine::OpenMode::ReadOnly);
    auto q =
        con.prepare("SELECT r.name, SUM(f.fwd_executed) / 1e9 FROM flops f JOIN runs r ON r.id = f.run_id WHERE " +
                    where + " AND f.step = (SELECT MAX(step) FROM flops g WHERE g.run_id = f.run_id) GROUP BY r.name");
    while (q.step()) out[q.text(0)] = q.real(1);
    return out;
  };
  const auto cells_of = [&](const std::set<std::string>& attention) {
    std::map<std::string, std::string> out;
    for (const auto& row : engine::read_results(db, attention)) out[row.cells[0]] = row.cells[4];
    return out;
  };
  const auto view_of = [&] {
    std::map<std::string, double> out;
    engine::Database con(db, engine::OpenMode::ReadOnly);
    auto q = con.prepare("SELECT name, attention_gflops FROM results WHERE attention_gflops IS NOT NULL");
    while (q.step()) out[q.text(0)] = q.real(1);
    return out;
  };
  const auto agrees = [](const std::map<std::string, double>& expected,
                         const std::map<std::string, std::string>& cells) {
    int counted = 0;
    for (const auto& [name, gflops] : expected) {
      INFO(name);
      ++counted;
      REQUIRE(cells.count(name));
      CHECK(std::stod(cells.at(name)) == Approx(gflops).epsilon(1e-4));
    }
    return counted;
  };

  SECTION("a flagged row counts whatever plugins are loaded; the store's view agrees") {
    const auto expected = gflops_of("f.operator = 'attention'");
    CHECK(agrees(expected, cells_of({"attention"})) >= 6);  // a failed run records no FLOPs
    CHECK(agrees(expected, cells_of({})) >= 6);
    CHECK(agrees(expected, cells_of({"attention", "dct"})) >= 6);
    const auto view = view_of();
    REQUIRE(view.size() == expected.size());
    for (const auto& [name, gflops] : expected) CHECK(view.at(name) == Approx(gflops).epsilon(1e-12));
  }
  SECTION("a new attention-like operator counts by its flag, in show and in the view") {
    engine::Database(db).exec("UPDATE flops SET attention = 1 WHERE operator = 'dct'");
    const auto expected = gflops_of("f.operator IN ('attention', 'dct')");
    CHECK(agrees(expected, cells_of({"attention"})) >= 6);
    const auto view = view_of();
    for (const auto& [name, gflops] : expected) CHECK(view.at(name) == Approx(gflops).epsilon(1e-12));
  }
  SECTION("rows recorded before schema 9 carry no flag: the loaded traits decide") {
    engine::Database(db).exec("UPDATE flops SET attention = NULL");
    CHECK(agrees(gflops_of("f.operator = 'attention'"), cells_of({"attention"})) >= 6);
    CHECK(agrees(gflops_of("f.operator IN ('attention', 'dct')"), cells_of({"attention", "dct"})) >= 6);
    for (const auto& [name, cell] : cells_of({})) CHECK(cell.empty());
    CHECK(view_of().empty());
  }
  SECTION("a store of schema 8, read as it is: no flag column, the loaded traits decide") {
    engine::Database(db).exec(
        "DROP VIEW results; ALTER TABLE flops DROP COLUMN attention; "
        "CREATE VIEW results AS SELECT r.id, r.name, r.variant, r.task, r.seed, r.status, NULL AS main_metric, "
        "NULL AS metric_name, NULL AS attention_gflops, NULL AS total_gflops, r.train_tokens_per_s, "
        "r.eval_tokens_per_s, r.params, r.overhead_fraction FROM runs r WHERE r.status IN ('done', 'diverged', "
        "'failed'); UPDATE meta SET value = '8' WHERE key = 'schema_version'");
    CHECK(agrees(gflops_of("f.operator = 'attention'"), cells_of({"attention"})) >= 6);
    const auto summary = report::summarize(db, report::OperatorCatalog());  // default traits: nothing is attention
    for (const auto& r : summary.runs) CHECK(r.attn_fwd == 0);
  }
}
