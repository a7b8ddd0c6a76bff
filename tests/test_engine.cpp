#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <tuple>
#include <utility>

#include <ATen/ATen.h>
#include <torch/serialize.h>
#include <torch/utils.h>

#include <sstream>

#include <boost/filesystem.hpp>

#include "model/model.h"
#include "engine/config/matrix.h"
#include "engine/runtime/build_commit.h"
#include "engine/runtime/device.h"
#include "engine/store/sqlite.h"
#include "engine/store/store.h"
#include "chiar/conformance.h"
#include "chiar/error.h"
#include "chiar/linear.h"
#include "chiar/random.h"
#include "support/env_scope.h"
#include "support/faults.h"
#include "support/fixtures.h"
#include "support/process.h"
#include "support/skip.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::TempDir;

namespace {

std::vector<std::string> run_args(const TempDir& d, const std::string& db, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "run",         d.path() + "/m.toml", "--db", d.path() + "/" + db, "--data-root", d.path(),
      "--cache-dir", d.path() + "/cache"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// For runs whose metrics are compared bit for bit across stores: with "auto"
// each process times both product libraries at start-up and, on a busy
// machine, two of them may pick different ones (a resumed run keeps its own).
std::vector<std::string> pinned_run_args(const TempDir& d, const std::string& db, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = run_args(d, db, std::move(extra));
  args.insert(args.begin(), {"--gemm", "blas"});
  return args;
}

int64_t count(const std::string& db, const std::string& sql) {
  engine::Database con(db);
  auto q = con.prepare(sql);
  return q.step() ? q.integer(0) : -1;
}

std::vector<double> final_metrics(const std::string& db, const std::string& name_glob) {
  return test::test_split_metrics(db, name_glob);
}

// Polls the store until a run has recorded `step` (heartbeat) or times out.
bool wait_for_step(const std::string& db, int64_t step) {
  for (int i = 0; i < 600; ++i) {
    if (boost::filesystem::exists(db)) {
      try {
        if (count(db, "SELECT MAX(step) FROM runs") >= step) return true;
      } catch (const UserError&) {
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

TEST_CASE("run: a 2x2x2 matrix, a no-op rerun, show and export", "[engine][e2e]") {
  TempDir d("e2e");
  test::write_e2e_matrix(d);
  const std::string db = d.path() + "/r.db";
  const auto first = test::run_chiar(run_args(d, "r.db"));
  INFO(first.output);
  REQUIRE(first.status == 0);
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 8);
  CHECK(count(db, "SELECT COUNT(*) FROM results WHERE main_metric IS NOT NULL") == 8);
  CHECK(count(db, "SELECT COUNT(DISTINCT checkpoint) FROM metrics WHERE split = 'test'") == 2);
  CHECK(count(db, "SELECT COUNT(*) FROM routing WHERE operator = 'attention'") == 4 * 2);  // 4 routed runs x 2 evals
  CHECK(count(db, "SELECT COUNT(*) FROM histograms WHERE bin = 19") == 4 * 2);
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE blas LIKE '%blas%' AND gemm_gflops > 0 AND threads = 1") == 8);
  // Trained on the CPU: no GPU memory marks.
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE peak_gpu_allocated_mb IS NULL AND peak_gpu_reserved_mb IS NULL") ==
        8);
  // The library that ran the products, and why ("auto" times both).
  CHECK(count(db,
              "SELECT COUNT(*) FROM runs WHERE gemm LIKE 'onednn: oneDNN % sgemm, ISA %; auto: %' OR "
              "gemm = 'blas (auto: this build has no oneDNN)' OR gemm LIKE 'blas (libtorch''s path); auto: %'") == 8);
  // Harness overhead recorded per run, its fraction consistent with its parts.
  CHECK(
      count(db,
            "SELECT COUNT(*) FROM runs WHERE overhead_fraction > 0 AND "
            "json_extract(overhead, '$.steps_s') > 0 AND json_extract(overhead, '$.store_s') > 0 AND "
            "json_extract(overhead, '$.accounting_s') > 0 AND json_extract(overhead, '$.checkpoints_s') > 0 AND "
            "ABS(overhead_fraction - (json_extract(overhead, '$.store_s') + json_extract(overhead, '$.accounting_s') + "
            "json_extract(overhead, '$.progress_s')) / json_extract(overhead, '$.steps_s')) < 1e-4 * "
            "overhead_fraction") == 8);
  const auto finished = count(db, "SELECT SUM(LENGTH(finished_at)) FROM runs");
  const auto again = test::run_chiar(run_args(d, "r.db"));
  CHECK(again.status == 0);
  CHECK_THAT(again.output, Catch::Matchers::Contains("all 8 runs finished before"));
  CHECK(count(db, "SELECT SUM(LENGTH(finished_at)) FROM runs") == finished);
  const auto show = test::run_chiar({"show", db});
  CHECK(show.status == 0);
  CHECK_THAT(show.output, Catch::Matchers::Contains("routed/flat/seed=1"));
  const auto csv = test::run_chiar({"export", db, "--csv"});
  CHECK(std::count(csv.output.begin(), csv.output.end(), '\n') == 9);
  const auto json = test::run_chiar({"export", db, "--json"});
  CHECK_THAT(json.output, Catch::Matchers::Contains("\"metric\": \"accuracy\""));
}

// Runs name the commit the binary was built from, not the working
// directory's: here the CLI runs from a folder outside any git checkout.
TEST_CASE("run: provenance names the build's commit wherever the CLI runs from", "[engine][e2e]") {
  const engine::BuildCommit built = engine::build_commit();
  const bool from_checkout = boost::filesystem::exists(std::string(CHIAR_SOURCE_DIR) + "/.git");
  if (from_checkout) {
    REQUIRE(built.commit.size() == 40);
    CHECK(built.commit.find_first_not_of("0123456789abcdef") == std::string::npos);
  } else {
    CHECK(built.commit.empty());
  }
  TempDir d("provenance");
  test::write_one_run_matrix(d, "prov", test::tiny_train_body());
  const auto here = boost::filesystem::current_path();
  boost::filesystem::current_path(d.path());  // the child inherits it
  const auto run = test::run_chiar(run_args(d, "r.db"));
  boost::filesystem::current_path(here);
  INFO(run.output);
  REQUIRE(run.status == 0);
  engine::Database con(d.path() + "/r.db");
  auto q = con.prepare("SELECT git_commit, git_dirty FROM runs");
  REQUIRE(q.step());
  CHECK(q.text(0) == built.commit);
  CHECK((q.integer(1) != 0) == built.dirty);
}

TEST_CASE("store: an older database is migrated to the current schema on open", "[engine][store]") {
  TempDir d("migrate");
  const std::string db = d.path() + "/old.db";
  {
    engine::Store store(db);
    engine::Database con(db);
    con.exec(
        "INSERT INTO runs(hash, name, matrix, variant, task, seed, spec, created_at) "
        "VALUES ('h', 'v/t/seed=0', 'm', 'v', 't', 0, '{}', 'now')");
    // Back to schema 1: no spec_toml, no overhead or gemm columns, the old results view.
    con.exec(
        "DROP VIEW results; ALTER TABLE flops DROP COLUMN attention; ALTER TABLE runs DROP COLUMN spec_toml; "
        "ALTER TABLE runs DROP COLUMN overhead; "
        "ALTER TABLE runs DROP COLUMN overhead_fraction; ALTER TABLE runs DROP COLUMN gemm; CREATE VIEW results AS "
        "SELECT id, name FROM runs; "
        "UPDATE meta SET value = '1' WHERE key = 'schema_version'");
  }
  engine::Store store(db);
  CHECK(count(db, "SELECT value FROM meta WHERE key = 'schema_version'") == engine::kSchemaVersion);
  CHECK(count(db,
              "SELECT COUNT(*) FROM pragma_table_info('runs') WHERE name IN "
              "('spec_toml', 'overhead', 'overhead_fraction', 'gemm')") == 4);
  CHECK(count(db, "SELECT COUNT(*) FROM pragma_table_info('results') WHERE name = 'overhead_fraction'") == 1);
  CHECK(count(db, "SELECT COUNT(*) FROM pragma_table_info('flops') WHERE name = 'attention'") == 1);
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE hash = 'h'") == 1);
  // A database from a newer harness is refused rather than misread.
  {
    engine::Database con(db);
    con.exec("UPDATE meta SET value = '99' WHERE key = 'schema_version'");
  }
  CHECK_THROWS_WITH(engine::Store(db),
                    db + ": schema version 99 is newer than this harness's " + std::to_string(engine::kSchemaVersion));
}

TEST_CASE("run: bad configuration exits 2 and leaves no database", "[engine][errors]") {
  TempDir d("e2e-bad");
  test::write_e2e_matrix(d);
  d.write("bad.toml", "include = [\"m.toml\"]\n[variants.routed]\nrouter = \"mystery\"\n");
  const auto bad_router =
      test::run_chiar({"run", d.path() + "/bad.toml", "--db", d.path() + "/x.db", "--data-root", d.path()});
  CHECK(bad_router.status == 2);
  CHECK(bad_router.output == "chiar: " + d.path() +
                                 "/bad.toml:3:10: key 'variants.routed.router': unknown router 'mystery' (known: "
                                 "hard_ste, soft, threshold, topk_entropy)\n");
  // A dry run builds no model but refuses the same names with the same
  // message: routers, operators and task plugins.
  const auto bad_router_listed = test::run_chiar({"run", d.path() + "/bad.toml", "--dry-run", "--data-root", d.path()});
  CHECK(bad_router_listed.status == 2);
  CHECK(bad_router_listed.output == bad_router.output);
  const auto bad_operator = test::run_chiar(
      {"run", d.path() + "/m.toml", "--dry-run", "--data-root", d.path(), "--set", "model.layers=[\"atn\"]"});
  CHECK(bad_operator.status == 2);
  CHECK(bad_operator.output ==
        "chiar: --set model.layers: unknown operator 'atn' (known: attention (attn), dct, fourier, rbf)\n");
  // A router's refusal that quotes its key is named where that key was set,
  // here over the variant's own router_params.
  const auto bad_shares = test::run_chiar({"run", d.path() + "/m.toml", "--dry-run", "--data-root", d.path(), "--only",
                                           "routed/*", "--set", "router.shares=[0.5, 0.6]"});
  CHECK(bad_shares.status == 2);
  CHECK_THAT(bad_shares.output, Catch::Matchers::StartsWith("chiar: --set router.shares: router 'threshold' (") &&
                                    Catch::Matchers::EndsWith("threshold: 'shares' must sum to 1, found 1.100000\n"));
  d.write("bad.toml", "include = [\"m.toml\"]\n[tasks.flat]\nplugin = \"listops_flatt\"\n");
  const auto bad_task = test::run_chiar({"run", d.path() + "/bad.toml", "--dry-run", "--data-root", d.path()});
  CHECK(bad_task.status == 2);
  CHECK(bad_task.output == "chiar: " + d.path() +
                               "/bad.toml:3:10: key 'tasks.flat.plugin': task 'flat': unknown task 'listops_flatt' "
                               "(known: imdb, listops, "
                               "listops_flat, wikitext)\n");
  // The harness has no layer plan of its own: a variant without one is refused.
  d.write("bad.toml", "include = [\"m.toml\"]\n[variants.routed]\nlayers = []\n");
  const auto no_layers =
      test::run_chiar({"run", d.path() + "/bad.toml", "--db", d.path() + "/x.db", "--data-root", d.path()});
  CHECK(no_layers.status == 2);
  const std::string no_layers_message = "chiar: " + d.path() +
                                        "/bad.toml:2:1: variant 'routed' on task 'lm': model.layers is required: one "
                                        "operator per block, or operators joined by '|' for a routed layer (`chiar "
                                        "plugins` lists the operators)\n";
  CHECK(no_layers.output == no_layers_message);
  // Before anything is listed (or submitted to Slurm) too.
  const auto no_layers_listed = test::run_chiar({"run", d.path() + "/bad.toml", "--dry-run", "--data-root", d.path()});
  CHECK(no_layers_listed.status == 2);
  CHECK(no_layers_listed.output == no_layers_message);
  // Nor a router: a routed plan names its own, at its variant's line.
  d.write("bad.toml", "include = [\"m.toml\"]\n[variants.routed]\nrouter = \"\"\n");
  const auto no_router = test::run_chiar({"run", d.path() + "/bad.toml", "--dry-run", "--data-root", d.path()});
  CHECK(no_router.status == 2);
  CHECK(no_router.output == "chiar: " + d.path() +
                                "/bad.toml:2:1: variant 'routed' on task 'lm': model.router is required: layer 2 "
                                "('dct|attn') is routed (`chiar plugins` lists the routers)\n");
  d.write("bad.toml", "include = [\"m.toml\"]\n[tasks.lm]\npath = \"missing\"\n");
  const auto bad_data =
      test::run_chiar({"run", d.path() + "/bad.toml", "--db", d.path() + "/x.db", "--data-root", d.path()});
  CHECK(bad_data.status == 2);
  CHECK_THAT(bad_data.output, Catch::Matchers::Contains("task 'lm': task 'wikitext'"));
  CHECK_THAT(bad_data.output, Catch::Matchers::Contains("missing/wiki.train.tokens: cannot open the file"));
  // Every sweep point's model is built before any run starts, not only the
  // first point of a variant on a task: here the second cannot serve a
  // language model.
  d.write("bad.toml", "include = [\"m.toml\"]\n[sweep]\nmodel.layers = [[\"attn\"], [\"fourier\"]]\n");
  const auto bad_point = test::run_chiar(
      {"run", d.path() + "/bad.toml", "--db", d.path() + "/x.db", "--data-root", d.path(), "--only", "base/lm/*"});
  CHECK(bad_point.status == 2);
  CHECK_THAT(bad_point.output, Catch::Matchers::EndsWith(": variant 'base' on task 'lm': layer 1: operator 'fourier' "
                                                         "does not support causal language modelling (it reads "
                                                         "future tokens)\n"));
  const auto bad_shard = test::run_chiar(run_args(d, "x.db", {"--shard", "4/3"}));
  CHECK(bad_shard.status == 2);
  CHECK(!boost::filesystem::exists(d.path() + "/x.db"));
}

TEST_CASE("run: a forced divergence is recorded and the matrix goes on", "[engine][diverge]") {
  TempDir d("e2e-nan");
  test::write_e2e_matrix(d, "lr = 1e12\nclip = 0.0\n");
  const auto r = test::run_chiar(run_args(d, "n.db", {"--only", "*/lm/seed=0"}));
  CHECK(r.status == 0);
  const std::string db = d.path() + "/n.db";
  CHECK(
      count(db, "SELECT COUNT(*) FROM runs WHERE status = 'diverged' AND diverged_step > 0 AND error LIKE 'loss %'") ==
      2);
}

namespace {

// Every validation and test metric of every run, in a fixed order, each as
// "run step split/checkpoint/name value" with every digit of the value.
std::vector<std::string> all_metrics(const std::string& db) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(
      "SELECT r.name, m.step, m.split || '/' || m.checkpoint || '/' || m.name, m.value "
      "FROM metrics m JOIN runs r ON r.id = m.run_id ORDER BY r.name, m.step, m.split, "
      "m.checkpoint, m.name");
  std::vector<std::string> rows;
  while (q.step()) {
    std::ostringstream row;
    row.precision(17);
    row << q.text(0) << " " << q.integer(1) << " " << q.text(2) << " " << q.real(3);
    rows.push_back(row.str());
  }
  return rows;
}

}  // namespace

// Late loss reads (CHIAR_LOSS_READS, engine/training/trainer.h) are what a GPU run
// does; here the CPU is made to read late, so that every branch of it runs
// where a test can see it. Nine steps, validated and checkpointed every
// four, so that most steps are read late; two micro-batches a step.
TEST_CASE("run: late loss reads log, score, stop, resume and diverge as reads every step do", "[engine][loss_reads]") {
  TempDir d("e2e-loss-reads");
  test::write_e2e_matrix(d, "log_every = 1\ngrad_accum = 2\n");
  const std::vector<std::string> nine = {"--only",   "*/*/seed=0",
                                         "--set",    "train.steps=9",
                                         "--set",    "train.eval_every=4",
                                         "--set",    "train.checkpoint_every=4",
                                         "--device", "cpu"};
  const auto run_with = [&](const std::string& reads, const std::string& db, std::vector<std::string> extra) {
    test::EnvScope env("CHIAR_LOSS_READS", reads);
    return test::run_chiar(pinned_run_args(d, db, std::move(extra)));
  };
  const std::string every = d.path() + "/every.db", late = d.path() + "/late.db";
  REQUIRE(run_with("every-step", "every.db", nine).status == 0);
  REQUIRE(run_with("late", "late.db", nine).status == 0);
  REQUIRE(test::train_logs(every).size() == 4 * 9);  // 4 runs, every step logged
  CHECK(test::train_logs(late) == test::train_logs(every));
  REQUIRE(all_metrics(every).size() > 8);
  CHECK(all_metrics(late) == all_metrics(every));
  // Every run timed, from the steps read late as from the others.
  CHECK(count(late,
              "SELECT COUNT(*) FROM runs WHERE step_ms > 0 AND train_tokens_per_s > 0 AND "
              "overhead LIKE '{\"steps_s\": %'") == 4);

  // A stop requested at a step read late is honoured at the next step, which
  // is read before its update; resumed, the run ends as it would have.
  {
    std::vector<std::string> one = nine;
    one[1] = "routed/lm/seed=0";
    {
      test::EnvScope stop("CHIAR_FAILPOINT", "train.step:6:term");
      const auto stopped = run_with("late", "stopped.db", one);
      INFO(stopped.output);
      REQUIRE(stopped.status == 130);
    }
    const std::string db = d.path() + "/stopped.db";
    CHECK(count(db, "SELECT step FROM runs WHERE status = 'interrupted'") == 7);
    const auto resumed = run_with("late", "stopped.db", one);
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK(final_metrics(db, "routed/lm/seed=0") == final_metrics(every, "routed/lm/seed=0"));
    auto expected = test::train_logs(every);
    expected.erase(std::remove_if(expected.begin(), expected.end(),
                                  [](const test::TrainLogRow& row) { return row.run != "routed/lm/seed=0"; }),
                   expected.end());
    CHECK(test::train_logs(db) == expected);
  }

  // A divergence found a step late is recorded at the step that diverged.
  {
    std::vector<std::string> diverging = nine;
    diverging.insert(diverging.end(), {"--set", "train.lr=1e12", "--set", "train.clip=0"});
    REQUIRE(run_with("every-step", "every-nan.db", diverging).status == 0);
    REQUIRE(run_with("late", "late-nan.db", diverging).status == 0);
    const std::string sql = "SELECT name || ' ' || diverged_step || ' ' || error FROM runs ORDER BY name";
    const auto outcomes = [&](const std::string& db) {
      engine::Database con(d.path() + "/" + db, engine::OpenMode::ReadOnly);
      auto q = con.prepare(sql);
      std::vector<std::string> rows;
      while (q.step()) rows.push_back(q.text(0));
      return rows;
    };
    REQUIRE(count(d.path() + "/every-nan.db", "SELECT COUNT(*) FROM runs WHERE status = 'diverged'") == 4);
    // Read late: neither validated nor checkpointed (every 4) nor the last.
    CHECK(count(d.path() + "/every-nan.db", "SELECT COUNT(*) FROM runs WHERE diverged_step % 4 != 0") == 4);
    CHECK(outcomes("late-nan.db") == outcomes("every-nan.db"));
    CHECK(test::train_logs(d.path() + "/late-nan.db") == test::train_logs(d.path() + "/every-nan.db"));
    CHECK(all_metrics(d.path() + "/late-nan.db") == all_metrics(d.path() + "/every-nan.db"));
    // Nothing kept of a step at or after the divergence (the step read
    // before its update that follows a diverged step read late included).
    CHECK(count(d.path() + "/late-nan.db",
                "SELECT COUNT(*) FROM checkpoints c JOIN runs r ON r.id = c.run_id "
                "WHERE c.step >= r.diverged_step") == 0);
  }

  // Another value is refused before anything is written.
  {
    const auto refused = run_with("sometimes", "refused.db", nine);
    CHECK(refused.status == 2);
    CHECK(refused.output == "chiar: CHIAR_LOSS_READS: \"sometimes\" is not one of every-step, late\n");
    CHECK_FALSE(boost::filesystem::exists(d.path() + "/refused.db"));
  }
}

TEST_CASE("run: interrupted by SIGINT, or killed, then resumed, ends as an uninterrupted run", "[engine][resume]") {
  TempDir d("e2e-resume");
  test::write_e2e_matrix(d, "log_every = 1\n");
  const std::vector<std::string> one = {"--only", "routed/lm/seed=1",         "--set", "train.steps=120",
                                        "--set",  "train.checkpoint_every=7", "--set", "train.eval_every=40"};
  REQUIRE(test::run_chiar(pinned_run_args(d, "ref.db", one)).status == 0);
  const auto reference = final_metrics(d.path() + "/ref.db", "routed/lm/seed=1");
  REQUIRE(reference.size() > 4);

  for (int sig : {SIGINT, SIGKILL}) {
    INFO("signal " << sig);
    const std::string name = sig == SIGINT ? "int.db" : "kill.db";
    const std::string db = d.path() + "/" + name;
    const pid_t pid = test::spawn_chiar(pinned_run_args(d, name, one), d.path() + "/log.txt");
    REQUIRE(wait_for_step(db, 30));
    kill(pid, sig);
    const int status = test::wait_chiar(pid);
    if (sig == SIGINT) {
      CHECK(status == 130);
      CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'interrupted'") == 1);
    } else {
      CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'running'") == 1);  // its process is dead
    }
    CHECK(count(db, "SELECT MAX(step) FROM runs") < 120);
    const auto resumed = test::run_chiar(pinned_run_args(d, name, one));
    INFO(resumed.output);
    CHECK(resumed.status == 0);
    CHECK_THAT(resumed.output, Catch::Matchers::Contains("resuming"));
    CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 1);
    CHECK(final_metrics(db, "routed/lm/seed=1") == reference);
  }
}

TEST_CASE("run: a resumed run keeps the GEMM library it began on, or says that it switched", "[engine][resume]") {
  if (!onednn_available()) CHIAR_SKIP("[resume]", "this build has no oneDNN, so every run has one library");
  // CHIAR_GEMM would make "auto" a library asked for: the children run without it.
  const char* inherited = std::getenv("CHIAR_GEMM");
  const std::string kept_gemm = inherited ? inherited : "";
  unsetenv("CHIAR_GEMM");
  struct Restore {
    const std::string& value;
    bool set;
    ~Restore() {
      if (set) setenv("CHIAR_GEMM", value.c_str(), 1);
    }
  } restore{kept_gemm, inherited != nullptr};
  TempDir d("e2e-gemm-resume");
  test::write_e2e_matrix(d);
  const auto args = [&](const std::string& gemm, const std::string& db) {
    auto a = run_args(d, db, {"--only", "routed/lm/seed=0", "--set", "train.steps=12"});
    if (!gemm.empty()) a.insert(a.begin(), {"--gemm", gemm});
    return a;
  };
  const auto gemm_of = [](const std::string& db) {
    engine::Database con(db);
    auto q = con.prepare("SELECT gemm FROM runs WHERE status = 'done'");
    return q.step() ? q.text(0) : std::string("(no finished run)");
  };
  const auto stopped_on = [&](const std::string& gemm, const std::string& db) {
    setenv("CHIAR_FAILPOINT", "train.step:5:term", 1);
    const auto stopped = test::run_chiar(args(gemm, db));
    unsetenv("CHIAR_FAILPOINT");
    INFO(stopped.output);
    REQUIRE(stopped.status == 130);
    engine::Database con(d.path() + "/" + db);
    auto q = con.prepare("SELECT gemm FROM runs WHERE status = 'interrupted'");
    REQUIRE(q.step());
    return q.text(0);
  };

  // Begun on each library, resumed with the default "auto": whichever library
  // the timing picks (so one of the two resumptions is timed onto the other
  // library), the run ends on the one it began on, with that process's record.
  for (const std::string library : {"blas", "onednn"}) {
    INFO("begun on " << library);
    REQUIRE(test::run_chiar(args(library, "ref-" + library + ".db")).status == 0);
    const auto reference = final_metrics(d.path() + "/ref-" + library + ".db", "routed/lm/seed=0");
    REQUIRE(!reference.empty());
    const std::string db = "auto-" + library + ".db";
    const std::string began = stopped_on(library, db);
    REQUIRE_THAT(began, Catch::Matchers::StartsWith(library));
    const auto resumed = test::run_chiar(args("", db));
    INFO(resumed.output);
    REQUIRE(resumed.status == 0);
    CHECK(gemm_of(d.path() + "/" + db) == began);
    CHECK(final_metrics(d.path() + "/" + db, "routed/lm/seed=0") == reference);
  }

  // Resumed asking for the BLAS: obeyed, and the console and the record say so.
  stopped_on("onednn", "asked.db");
  const auto asked = test::run_chiar(args("blas", "asked.db"));
  INFO(asked.output);
  REQUIRE(asked.status == 0);
  CHECK_THAT(asked.output, Catch::Matchers::Contains(
                               "; resumes on blas (as asked); it began on onednn, so its results will differ from an "
                               "uninterrupted run's\n"));
  CHECK(gemm_of(d.path() + "/asked.db") == "blas (libtorch's path); switched from onednn at resumption");
}

TEST_CASE("run: checkpoints left by a deleted database are discarded, not resumed", "[engine][resume]") {
  TempDir d("e2e-stale");
  test::write_e2e_matrix(d);
  const std::vector<std::string> one = {"--only", "routed/lm/seed=0"};
  const std::string db = d.path() + "/r.db";
  REQUIRE(test::run_chiar(pinned_run_args(d, "r.db", one)).status == 0);
  const auto reference = final_metrics(db, "routed/lm/seed=0");
  REQUIRE(boost::filesystem::exists(db + ".checkpoints"));
  boost::filesystem::remove(db);  // the database goes, its checkpoints stay
  const auto again = test::run_chiar(pinned_run_args(d, "r.db", one));
  INFO(again.output);
  REQUIRE(again.status == 0);
  CHECK_THAT(again.output, Catch::Matchers::Contains("that this database has no record of"));
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done' AND train_tokens_per_s > 0 AND step = 6") == 1);
  CHECK(final_metrics(db, "routed/lm/seed=0") == reference);
}

TEST_CASE("run: two processes on one database run every run exactly once", "[engine][concurrency]") {
  TempDir d("e2e-two");
  test::write_e2e_matrix(d);
  const pid_t a = test::spawn_chiar(run_args(d, "c.db"), d.path() + "/a.txt");
  const pid_t b = test::spawn_chiar(run_args(d, "c.db"), d.path() + "/b.txt");
  CHECK(test::wait_chiar(a) == 0);
  CHECK(test::wait_chiar(b) == 0);
  std::string logs;
  for (const char* f : {"/a.txt", "/b.txt"}) {
    std::ifstream in(d.path() + f);
    logs += std::string(std::istreambuf_iterator<char>(in), {});
  }
  INFO(logs);
  size_t starts = 0;
  for (size_t at = logs.find(": starting"); at != std::string::npos; at = logs.find(": starting", at + 1)) ++starts;
  CHECK(starts == 8);
  CHECK(logs.find("database is locked") == std::string::npos);
  CHECK(count(d.path() + "/c.db", "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 8);
}

TEST_CASE("run: a run that fails is recorded, the matrix goes on, and the exit status is 1", "[engine]") {
  TempDir d("e2e-failing");
  test::write_e2e_matrix(d, "", R"(
[variants.broken]
layers = ["attn", "fails_in_forward"]
)");
  // The matrix lists its variants: add the broken one to it.
  std::stringstream text;
  text << std::ifstream(d.path() + "/m.toml").rdbuf();
  std::string toml = text.str();
  const std::string listed = R"(variants = ["base", "routed"])";
  toml.replace(toml.find(listed), listed.size(), R"(variants = ["base", "broken"])");
  d.write("m.toml", toml);
  setenv("CHIAR_PLUGIN_PATH", (std::string(CHIAR_TEST_PLUGIN_DIR) + "/fails_in_forward").c_str(), 1);
  const auto out = test::run_chiar(run_args(d, "f.db", {"--only", "*/lm/seed=0"}));
  unsetenv("CHIAR_PLUGIN_PATH");
  INFO(out.output);
  CHECK(out.status == 1);
  CHECK(out.output.find("broken/lm/seed=0: failed: fails_in_forward: out of luck") != std::string::npos);
  CHECK(out.output.find("2 run, 0 skipped, 1 failed") != std::string::npos);
  const std::string db = d.path() + "/f.db";
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 1);
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'failed' AND error LIKE '%out of luck%'") == 1);
}

TEST_CASE("run: bf16 autocast trains to finite metrics close to fp32", "[engine][bf16]") {
  TempDir d("e2e-bf16");
  test::write_e2e_matrix(d);
  const std::vector<std::string> only = {"--only", "routed/lm/seed=0"};
  auto bf = only;
  bf.insert(bf.end(), {"--set", "train.precision=bf16"});
  const auto bf_run = test::run_chiar(run_args(d, "bf.db", bf));
  INFO(bf_run.output);
  REQUIRE(bf_run.status == 0);
  // Warned where this CPU's bf16 products sum in bf16, and only there.
  CHECK((bf_run.output.find("warning: precision \"bf16\" on this CPU") != std::string::npos) ==
        !chiar::cpu_bf16_sums_in_fp32());
  REQUIRE(test::run_chiar(run_args(d, "fp.db", only)).status == 0);
  const auto q = "SELECT main_metric FROM results";
  engine::Database bf_db(d.path() + "/bf.db"), fp_db(d.path() + "/fp.db");
  auto a = bf_db.prepare(q), b = fp_db.prepare(q);
  REQUIRE(a.step());
  REQUIRE(b.step());
  CHECK(std::isfinite(a.real(0)));
  CHECK(a.real(0) == Approx(b.real(0)).epsilon(0.05));
}

TEST_CASE("inspect: the routes printed are the model's own routing decisions", "[engine][inspect]") {
  TempDir d("inspect");
  test::write_e2e_matrix(d);
  REQUIRE(test::run_chiar(run_args(d, "i.db", {"--only", "routed/lm/seed=0"})).status == 0);
  const std::string db = d.path() + "/i.db";
  const std::string text = "the route of a token is cheap or not the entropy";
  const auto out = test::run_chiar({"inspect", db, "--run", "routed/lm/seed=0", "--text", text, "--tsv", "--data-root",
                                    d.path(), "--cache-dir", d.path() + "/cache", "--html", d.path() + "/routes.html"});
  INFO(out.output);
  REQUIRE(out.status == 0);

  // The same model, rebuilt here from the stored spec and the best checkpoint.
  engine::Database con(db);
  auto q = con.prepare("SELECT spec_toml, hash FROM runs WHERE name = 'routed/lm/seed=0'");
  REQUIRE(q.step());
  const auto spec = engine::run_spec_from_toml(q.text(0));
  TaskSpec ts;
  ts.params = spec.task_config.params;
  ts.data_root = d.path();
  ts.cache_dir = d.path() + "/cache";
  auto task = test::plugins().make_task(spec.task_config.plugin, ts);
  model::ModelOptions mo = spec.model;
  mo.vocab_size(task->vocab_size()).head(TaskHead::LanguageModel);
  model::ChiarModel model(test::plugins(), mo);
  // The best model the store recorded (state-<step>.pt / best-<step>.pt).
  auto best = con.prepare(
      "SELECT c.file FROM checkpoints c JOIN runs r ON r.id = c.run_id "
      "WHERE r.name = 'routed/lm/seed=0' AND c.kind = 'best' ORDER BY c.step DESC");
  REQUIRE(best.step());
  torch::serialize::InputArchive archive;
  archive.load_from(best.text(0));
  model.load(archive);
  model.eval();
  at::NoGradGuard no_grad;
  const auto ids = task->encode(text);
  const auto routing = model.forward(at::tensor(ids, at::TensorOptions().dtype(at::kLong)).view({1, -1})).routing;
  REQUIRE(routing.size() == 1);

  std::istringstream lines(out.output);
  std::string line;
  std::getline(lines, line);
  CHECK(line == "token\tid\tL2_H\tL2_route");
  int64_t i = 0, attention = 0;
  while (std::getline(lines, line) && line.find('\t') != std::string::npos) {
    std::istringstream fields(line);
    std::string token, id, h, route;
    std::getline(fields, token, '\t');
    std::getline(fields, id, '\t');
    std::getline(fields, h, '\t');
    std::getline(fields, route, '\t');
    REQUIRE(i < static_cast<int64_t>(ids.size()));
    CHECK(std::stoll(id) == ids[i]);
    CHECK(std::stod(h) == Approx(routing[0].entropy[0][i].item<double>()).margin(1e-6));
    const std::string expected = routing[0].choice[0][i].item<int64_t>() == 1 ? "attention" : "dct";
    CHECK(route == expected);
    attention += route == "attention";
    ++i;
  }
  CHECK(i == static_cast<int64_t>(ids.size()));
  std::ifstream html(d.path() + "/routes.html");
  const std::string page((std::istreambuf_iterator<char>(html)), {});
  size_t spans = 0;
  for (size_t at = page.find("class=\"t\""); at != std::string::npos; at = page.find("class=\"t\"", at + 1)) ++spans;
  CHECK(spans == ids.size());
  // The checkpoint folder alone (it holds spec.toml) gives the same routes.
  const auto from_checkpoint = test::run_chiar({"inspect", db + ".checkpoints/" + q.text(1), "--text", text, "--tsv",
                                                "--data-root", d.path(), "--cache-dir", d.path() + "/cache"});
  CHECK(from_checkpoint.status == 0);
  CHECK(from_checkpoint.output == out.output.substr(0, out.output.find("wrote ")));
  CHECK(test::run_chiar({"inspect", db, "--text", "x"}).output ==
        "chiar: " + db + ": a database needs --run (id, name or hash; `chiar show` lists them)\n");
  CHECK(test::run_chiar({"inspect", db, "--run", "nope", "--text", "x"}).output ==
        "chiar: " + db + ": no run 'nope' (give its id, name or hash; `chiar show` lists them)\n");
}

TEST_CASE("run: the fnet and chiar_topk variants run in a matrix; fnet is refused for LM", "[engine][plugins7]") {
  TempDir d("e2e-new");
  test::write_e2e_matrix(d);
  const std::string variants = std::string(CHIAR_SOURCE_DIR) + "/configs/variants.toml";
  d.write("new.toml",
          "include = [\"" + variants +
              "\", \"m.toml\"]\n[matrix]\nvariants = [\"chiar_topk\", \"fnet\"]\ntasks = [\"flat\"]\nseeds = [0]\n");
  const auto ok = test::run_chiar({"run", d.path() + "/new.toml", "--db", d.path() + "/n.db", "--data-root", d.path(),
                                   "--cache-dir", d.path() + "/cache"});
  INFO(ok.output);
  CHECK(ok.status == 0);
  CHECK(count(d.path() + "/n.db", "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 2);
  d.write("lm.toml", "include = [\"" + variants +
                         "\", \"m.toml\"]\n[matrix]\nvariants = [\"fnet\"]\ntasks = [\"lm\"]\nseeds = [0]\n");
  const auto refused =
      test::run_chiar({"run", d.path() + "/lm.toml", "--db", d.path() + "/x.db", "--data-root", d.path()});
  CHECK(refused.status == 2);
  CHECK_THAT(
      refused.output,
      Catch::Matchers::Contains(
          "variant 'fnet' on task 'lm': layer 1: operator 'fourier' does not support causal language modelling"));
  CHECK(!boost::filesystem::exists(d.path() + "/x.db"));
}
