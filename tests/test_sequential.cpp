// The group-sequential design: its boundaries against published ones, and
// by simulation, its error rate against testing after every round.
#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "engine/store/sqlite.h"
#include "report/sequential.h"
#include "report/verdict_stats.h"
#include "support/faults.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::TempDir;

TEST_CASE("sequential design: Lan-DeMets O'Brien-Fleming boundaries match the published ones", "[report][sequential]") {
  // Two-sided alpha 0.05 (0.025 a side), equally spaced looks: 3.7103,
  // 2.5114, 1.9930 (Jennison and Turnbull 2000; R's gsDesign with sfLDOF).
  // The first is the spending function's alone: z at 2 - 2 Phi(2.2414 sqrt 3).
  const auto three = report::obrien_fleming_design(30, 3, 0.05);
  CHECK(three.seeds == std::vector<int>{10, 20, 30});
  REQUIRE(three.z.size() == 3);
  CHECK(three.z[0] == Approx(3.7103).margin(1e-3));
  CHECK(three.z[1] == Approx(2.5114).margin(2e-3));
  CHECK(three.z[2] == Approx(1.9930).margin(2e-3));
  CHECK(three.spent.back() == Approx(0.05));
  // One look is the fixed design.
  const auto one = report::obrien_fleming_design(10, 1, 0.05);
  CHECK(one.z[0] == Approx(1.959964).margin(1e-5));
  CHECK(one.nominal_p[0] == Approx(0.05).margin(1e-9));
  // Seeds per look round up; a first look under 3 seeds is refused.
  CHECK(report::obrien_fleming_design(10, 3, 0.05).seeds == std::vector<int>{4, 7, 10});
  CHECK_THROWS_WITH(report::obrien_fleming_design(6, 3, 0.05),
                    "--max-seeds 6 in 3 rounds gives a first round of 2 seeds; a test needs 3: raise --max-seeds or "
                    "lower --rounds");
}

namespace {

struct Simulated {
  double rejected = 0;    // share of comparisons decided (at any look)
  double naive = 0;       // share a t-test at 0.05 after every round would reject
  double mean_seeds = 0;  // seeds used before stopping, on average
};

// `count` paired comparisons whose per-seed differences are N(effect, 1),
// each run through the design's looks. Seeded: the same figures every run.
Simulated simulate(const report::SequentialDesign& design, double effect, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> noise(effect, 1.0);
  Simulated out;
  for (int i = 0; i < count; ++i) {
    std::vector<double> diffs(static_cast<size_t>(design.max_seeds));
    for (double& x : diffs) x = noise(rng);
    const std::vector<double> zeros(diffs.size(), 0.0);
    bool stopped = false, naive = false;
    for (size_t k = 0; k < design.seeds.size(); ++k) {
      const auto n = static_cast<size_t>(design.seeds[k]);
      const std::vector<double> a(diffs.begin(), diffs.begin() + static_cast<long>(n));
      const auto d = report::paired_difference(a, std::vector<double>(n, 0.0));
      naive |= d.p < 0.05;
      if (stopped) continue;
      const auto look = report::look_at(design, k, d);
      if (look.outcome == report::LookOutcome::Continue) continue;
      stopped = true;
      out.rejected += look.outcome == report::LookOutcome::Decided;
      out.mean_seeds += static_cast<double>(n);
    }
    out.naive += naive;
  }
  out.rejected /= count;
  out.naive /= count;
  out.mean_seeds /= count;
  return out;
}

}  // namespace

TEST_CASE(
    "sequential design: by simulation, the error rate holds where re-testing every round does not, and a real "
    "effect stops early",
    "[report][sequential]") {
  // 12 seeds in 3 rounds (4, 8, 12). Monte-Carlo error of a rate near 5%
  // over 10,000 comparisons: sqrt(0.05 x 0.95 / 10000) = 0.22 points.
  const auto design = report::obrien_fleming_design(12, 3, 0.05);
  const Simulated null = simulate(design, 0.0, 10000, 1);
  INFO("no effect: sequential " << null.rejected << ", naive " << null.naive << ", mean seeds " << null.mean_seeds);
  CHECK(null.rejected <= 0.05 + 2 * 0.0022);
  CHECK(null.naive > 0.05 + 4 * 0.0022);
  // d_z = 1: the fixed design needs 10 seeds for 80% power (Cohen 1988).
  REQUIRE(report::seeds_for_power(1.0, true, 1.0, 0, 0.05, 0.8, 100) == 10);
  const Simulated real = simulate(design, 1.0, 10000, 2);
  INFO("d_z 1: sequential power " << real.rejected << ", mean seeds " << real.mean_seeds << " (fixed: 10 seeds, 0.80)");
  CHECK(real.rejected >= 0.80 - 2 * 0.004);
  CHECK(real.mean_seeds < 10);
}

namespace {

int64_t count(const std::string& db, const std::string& sql) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(sql);
  return q.step() ? q.integer(0) : -1;
}

// The tiny matrix with 9 seeds (base and routed on lm and flat), and a
// claims file with one comparison, routed against base on lm.
std::string write_design_matrix(const TempDir& d) {
  test::write_tiny_matrix(d,
                          "name = \"seq\"\nvariants = [\"base\", \"routed\"]\ntasks = [\"lm\", \"flat\"]\n"
                          "seeds = [0, 1, 2, 3, 4, 5, 6, 7, 8]\n",
                          test::tiny_train_body());
  return d.write("claims.toml",
                 "include = [\"m.toml\"]\n\n[[claims]]\nid = \"routed_beats_base\"\ntext = \"routed beats base\"\n"
                 "kind = \"compare\"\ntask = \"lm\"\nvariants = [\"routed\", \"base\"]\nmetric = \"token_ppl\"\n"
                 "better = \"lower\"\n");
}

}  // namespace

TEST_CASE("chiar run --decide: rounds of seeds, looks recorded, seeds stop for closed comparisons, resumable",
          "[engine][sequential]") {
  TempDir d("decide");
  const std::string claims = write_design_matrix(d);
  const std::string db = d.path() + "/seq.db";
  const std::vector<std::string> base = {
      "run",         d.path() + "/m.toml", "--db",     db,    "--data-root", d.path(),
      "--cache-dir", d.path() + "/cache",  "--decide", claims};
  // --dry-run states the design and writes nothing.
  auto dry = base;
  dry.push_back("--dry-run");
  const auto planned = test::run_chiar(dry);
  INFO(planned.output);
  REQUIRE(planned.status == 0);
  CHECK_THAT(planned.output, Catch::Matchers::Contains("sequential design: up to 9 seeds in 3 rounds (3, 6, 9 seeds); "
                                                       "alpha 0.05 / 1 per comparison"));
  CHECK_FALSE(boost::filesystem::exists(db));

  const auto ran = test::run_chiar(base);
  INFO(ran.output);
  REQUIRE(ran.status == 0);
  CHECK(count(db, "SELECT max_seeds * 10 + rounds FROM sequential_design") == 93);
  // Each round after the first is looked at only when the one before said "continue".
  const int64_t rounds = count(db, "SELECT COUNT(*) FROM sequential_looks");
  REQUIRE(rounds >= 1);
  CHECK(count(db, "SELECT COUNT(*) FROM sequential_looks WHERE outcome = 'continue'") == rounds - 1);
  CHECK(count(db, "SELECT COUNT(*) FROM sequential_looks WHERE round = " + std::to_string(rounds - 1) +
                      " AND outcome IN ('decided', 'futile', 'final')") == 1);
  // The claim is about lm: flat keeps the first round's 3 seeds; lm has the
  // seeds of the last look, for both variants.
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE task = 'flat'") == 6);
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE task = 'lm' AND status = 'done'") == 2 * 3 * rounds);
  CHECK(count(db, "SELECT MAX(seeds) FROM sequential_looks") == 3 * rounds);

  // A rerun finds the design done and trains nothing.
  const auto again = test::run_chiar(base);
  CHECK(again.status == 0);
  CHECK_THAT(again.output, Catch::Matchers::Contains("design done: "));
  CHECK(again.output.find("starting") == std::string::npos);

  // The report decides the comparison at its look's boundary and states the
  // design (--allow-mixed-code: a build from a tree with uncommitted changes
  // marks its runs so, and the row would get no verdict).
  const auto reported = test::run_chiar(
      {"report", db, "--out", d.path() + "/r/seq", "--baseline", "base", "--claims", claims, "--allow-mixed-code"});
  INFO(reported.output);
  REQUIRE(reported.status == 0);
  const std::string md = test::read_text(d.path() + "/r/seq.md");
  CHECK_THAT(md, Catch::Matchers::Contains("The compare rows come from a group-sequential design"));
  // The row is tested at its latest look's boundary and says how the design
  // left it (which look and what outcome depend on this machine's numbers).
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto last = con.prepare("SELECT round, printf('%.3g', nominal), outcome FROM sequential_looks ORDER BY round DESC");
  REQUIRE(last.step());
  const std::string round = std::to_string(last.integer(0) + 1), outcome = last.text(2);
  CHECK_THAT(md, Catch::Matchers::Contains(" boundary " + last.text(1) + ", d_z"));
  CHECK_THAT(md,
             Catch::Matchers::Contains(outcome == "decided"  ? "(decided at round " + round + " of 3"
                                       : outcome == "futile" ? "(seeds stopped for futility at round " + round + " of 3"
                                                             : std::string("(undecided after the last round")));
  CHECK_THAT(md, Catch::Matchers::Contains("rounds (3, 6, 9 seeds), two-sided alpha 0.05 (0.05 / 1) per comparison"));

  // Another design on the same store is refused, writing nothing, and so are
  // more seeds than listed and a store of runs made without a design.
  const int64_t looks_before = count(db, "SELECT COUNT(*) FROM sequential_looks");
  auto other = base;
  other.insert(other.end(), {"--rounds", "2"});
  const auto refused = test::run_chiar(other);
  CHECK(refused.status == 2);
  CHECK(count(db, "SELECT COUNT(*) FROM sequential_looks") == looks_before);
  CHECK_THAT(refused.output, Catch::Matchers::Contains(db + ": holds runs of another sequential design (9 seeds in 3 "
                                                            "rounds over 1 tests"));
  auto many = base;
  many[3] = d.path() + "/other.db";
  many.insert(many.end(), {"--max-seeds", "12"});
  const auto too_many = test::run_chiar(many);
  CHECK(too_many.status == 2);
  CHECK(too_many.output ==
        "chiar: --max-seeds 12: the matrix lists 9 seeds; list at least as many in [matrix] seeds\n");
  const std::string plain = d.path() + "/plain.db";
  REQUIRE(test::run_chiar({"run", d.path() + "/m.toml", "--db", plain, "--data-root", d.path(), "--cache-dir",
                           d.path() + "/cache", "--only", "*/flat/seed=0"})
              .status == 0);
  auto on_plain = base;
  on_plain[3] = plain;
  const auto mixed = test::run_chiar(on_plain);
  CHECK(mixed.status == 2);
  CHECK_THAT(mixed.output, Catch::Matchers::EndsWith(
                               plain + ": holds 2 runs made without a sequential design; a design starts in a new "
                                       "store (--db)\n"));
  // A claim naming a variant the matrix lacks is refused where the claim is.
  d.write("more.toml", "[variants.other]\n");
  const std::string typo =
      d.write("typo.toml",
              "include = [\"m.toml\", \"more.toml\"]\n\n[[claims]]\nid = \"x\"\ntext = \"x\"\n"
              "kind = \"compare\"\ntask = \"lm\"\nvariants = [\"other\", \"base\"]\nmetric = \"token_ppl\"\n"
              "better = \"lower\"\n");
  auto with_typo = base;
  with_typo[3] = d.path() + "/typo.db";
  with_typo.back() = typo;
  const auto unknown = test::run_chiar(with_typo);
  CHECK(unknown.status == 2);
  CHECK(unknown.output == "chiar: " + typo + ":3:1: claim 'x': variant 'other' is not in " + d.path() +
                              "/m.toml; a design cannot test it\n");
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/typo.db"));
}

namespace {

// (round, claim, task, seeds, outcome) of every look a store holds, and p to 1e-9.
std::vector<std::string> looks_of(const std::string& db) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(
      "SELECT round, claim, task, seeds, outcome, printf('%.9f', p) FROM sequential_looks "
      "ORDER BY round, claim, task");
  std::vector<std::string> out;
  while (q.step())
    out.push_back(std::to_string(q.integer(0)) + " " + q.text(1) + " " + q.text(2) + " " +
                  std::to_string(q.integer(3)) + " " + q.text(4) + " " + q.text(5));
  return out;
}

}  // namespace

TEST_CASE("chiar slurm --decide: one array per round, looks between them, the same looks as one process",
          "[slurm_script][sequential]") {
  TempDir d("decide-slurm");
  const std::string claims = write_design_matrix(d);
  const std::string out = d.path() + "/out", script = out + "/slurm.sbatch";
  const std::vector<std::string> args = {"slurm",       d.path() + "/m.toml", "--dir",   out, "--data-root", d.path(),
                                         "--cache-dir", d.path() + "/cache",  "--tasks", "2", "--decide",    claims};
  int arrays = 0;
  for (int step = 0; step < 5; ++step) {
    const auto wrote = test::run_chiar(args);
    INFO(wrote.output);
    REQUIRE(wrote.status == 0);
    if (wrote.output.find("design done: ") != std::string::npos) break;
    CHECK_THAT(test::read_text(script), Catch::Matchers::Contains("--round-from"));
    ++arrays;
    for (const std::string k : {"1", "2"}) {
      // One product library in every process: "auto" times both at start-up,
      // and two busy processes may pick different ones.
      const int rc = std::system(("cd '" + d.path() + "' && CHIAR_GEMM=blas SLURM_ARRAY_TASK_ID=" + k + " bash '" +
                                  script + "' > '" + d.path() + "/task-" + k + ".log' 2>&1")
                                     .c_str());
      INFO(test::read_text(d.path() + "/task-" + k + ".log"));
      REQUIRE(rc == 0);
      if (step > 0 || k != "1") continue;
      // Half of round 1 has run: looking again takes no look and writes the
      // same round; with a run still running it is refused (two arrays would
      // train it at once), and nothing is looked at.
      const auto half = test::run_chiar(args);
      INFO(half.output);
      CHECK(half.status == 0);
      CHECK(half.output.find("has ended in") == std::string::npos);
      const std::string shard1 = out + "/shard-1.db";
      engine::Database(shard1).exec("UPDATE runs SET status = 'running' WHERE id = 1");
      const auto running = test::run_chiar(args);
      CHECK(running.status == 2);
      CHECK_THAT(running.output, Catch::Matchers::Contains("runs still running in " + out));
      engine::Database(shard1).exec("UPDATE runs SET status = 'done' WHERE id = 1");
      CHECK(count(out + "/design/sequential.db", "SELECT COUNT(*) FROM sequential_looks") == 0);
    }
  }
  CHECK(arrays >= 1);
  CHECK(arrays <= 3);
  // A task started after the design moved on (requeued late) runs nothing.
  const auto late = test::run_chiar({"run", d.path() + "/m.toml", "--shard", "1/2", "--db", out + "/shard-1.db",
                                     "--data-root", d.path(), "--cache-dir", d.path() + "/cache", "--decide", claims,
                                     "--round-from", out + "/design/sequential.db", "--round", "1"});
  INFO(late.output);
  CHECK(late.status == 0);
  CHECK_THAT(late.output, Catch::Matchers::Contains("round 1 is not the design's current round (it is done): "
                                                    "nothing to run"));
  // One process running the same design takes the same looks.
  const std::string local = d.path() + "/local.db";
  const auto ran = test::run_chiar({"--gemm", "blas", "run", d.path() + "/m.toml", "--db", local, "--data-root",
                                    d.path(), "--cache-dir", d.path() + "/cache", "--decide", claims});
  INFO(ran.output);
  REQUIRE(ran.status == 0);
  const auto by_arrays = looks_of(out + "/design/sequential.db");
  CHECK(by_arrays.size() == static_cast<size_t>(arrays));
  CHECK(by_arrays == looks_of(local));
  // The shards and the design merge into one store, which reports by the design.
  const std::string merged = d.path() + "/merged.db";
  const auto merging = test::run_chiar({"merge", merged, out, out + "/design/sequential.db"});
  INFO(merging.output);
  REQUIRE(merging.status == 0);
  CHECK(looks_of(merged) == by_arrays);
  const auto reported =
      test::run_chiar({"report", merged, "--out", d.path() + "/r/m", "--baseline", "base", "--claims", claims});
  INFO(reported.output);
  REQUIRE(reported.status == 0);
  CHECK_THAT(test::read_text(d.path() + "/r/m.md"),
             Catch::Matchers::Contains("The compare rows come from a group-sequential design"));
}
