// test_scale_out: a matrix spread over shard stores (a Slurm job array) and
// brought back together. `chiar merge` copies every run once, takes the copy
// that got furthest, refuses a conflict without writing; show and report
// read several stores; `chiar slurm` writes the job array's script; a
// --sole-writer run resumes what a dead array task left running. The real
// Slurm end to end is the ctest entry `slurm` (tests/slurm/).
#include <catch2/catch.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "engine/cluster/slurm_script.h"
#include "engine/store/merge.h"
#include "engine/store/sqlite.h"
#include "engine/store/store.h"
#include "support/faults.h"
#include "support/process.h"
#include "support/synthetic_store.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::TempDir;
namespace fs = boost::filesystem;

namespace {

// 2 variants x 1 task x 2 seeds of tiny runs that need no data files.
void write_matrix(const TempDir& d) {
  test::write_tiny_matrix(d, R"(name = "shards"
variants = ["base", "routed"]
tasks = ["flat"]
seeds = [0, 1]
)",
                          test::tiny_train_body());
}

using test::read_text;
using test::tiny_run_args;

// Runs the matrix as two shards, into <d>/shards/shard-{1,2}.db.
void run_two_shards(const TempDir& d) {
  for (const std::string k : {"1", "2"}) {
    auto args = tiny_run_args(d, d.path() + "/shards/shard-" + k + ".db");
    args.insert(args.end(), {"--shard", k + "/2"});
    const auto out = test::run_chiar(args);
    INFO(out.output);
    REQUIRE(out.status == 0);
  }
}

// Every row of every table, as text: equal dumps mean equal stores (run ids aside).
std::string dump(const std::string& db) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  std::ostringstream s;
  for (const std::string table :
       {"runs", "metrics", "train_log", "flops", "flops_reference", "routing", "histograms", "checkpoints"}) {
    auto q = con.prepare("SELECT * FROM " + table);
    std::vector<std::string> rows;
    while (q.step()) {
      std::string row = table + ":";
      for (int c = 0; c < q.columns(); ++c) {
        row += ' ';
        row += q.is_null(c) ? std::string("NULL") : q.text(c);
      }
      rows.push_back(row);
    }
    std::sort(rows.begin(), rows.end());
    for (const auto& row : rows) s << row << "\n";
  }
  return s.str();
}

std::map<std::string, std::string> status_by_name(const std::string& db) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare("SELECT name, status FROM runs");
  std::map<std::string, std::string> out;
  while (q.step()) out[q.text(0)] = q.text(1);
  return out;
}

void copy_file(const std::string& from, const std::string& to) {
  fs::copy_file(from, to, fs::copy_option::overwrite_if_exists);
}

}  // namespace

TEST_CASE("merge: shard stores combine into one holding every run once; merging again changes nothing", "[merge]") {
  TempDir d("merge-shards");
  write_matrix(d);
  run_two_shards(d);
  const std::string s1 = d.path() + "/shards/shard-1.db", s2 = d.path() + "/shards/shard-2.db";
  const std::string all = d.path() + "/all.db";
  REQUIRE(test::query_integer(s1, "SELECT COUNT(*) FROM runs") == 2);
  REQUIRE(test::query_integer(s2, "SELECT COUNT(*) FROM runs") == 2);

  const auto first = test::run_chiar({"merge", all, d.path() + "/shards"});
  INFO(first.output);
  REQUIRE(first.status == 0);
  CHECK(first.output == "merged 2 stores into " + all + ": 4 runs added, 0 updated, 0 unchanged\n");
  const auto status = status_by_name(all);
  REQUIRE(status.size() == 4);
  for (const auto& [name, s] : status) CHECK(s == "done");
  // Every record of every run came across, and its metrics bit for bit;
  // the checkpoint records stay with the shards whose folders hold the files.
  CHECK(test::query_integer(all, "SELECT COUNT(*) FROM checkpoints") == 0);
  CHECK(test::query_integer(s1, "SELECT COUNT(*) FROM checkpoints") > 0);
  for (const std::string table : {"metrics", "train_log", "flops", "routing", "histograms"}) {
    INFO(table);
    const std::string n = "SELECT COUNT(*) FROM " + table;
    CHECK(test::query_integer(all, n) == test::query_integer(s1, n) + test::query_integer(s2, n));
    CHECK(test::query_integer(all, n) > 0);
  }
  for (const auto& [name, s] : status) {
    const std::string shard = status_by_name(s1).count(name) ? s1 : s2;
    CHECK(test::test_split_metrics(all, name) == test::test_split_metrics(shard, name));
  }

  const std::string before = dump(all);
  const auto again = test::run_chiar({"merge", all, s2, s1});
  CHECK(again.status == 0);
  CHECK(again.output == "merged 2 stores into " + all + ": 0 runs added, 0 updated, 4 unchanged\n");
  CHECK(dump(all) == before);

  SECTION("a merge kept among the shards is skipped by the next merge of that folder") {
    const std::string inside = d.path() + "/shards/merged.db";
    const auto once = test::run_chiar({"merge", inside, d.path() + "/shards"});
    CHECK(once.output == "merged 2 stores into " + inside + ": 4 runs added, 0 updated, 0 unchanged\n");
    const auto twice = test::run_chiar({"merge", inside, d.path() + "/shards"});
    CHECK(twice.status == 0);
    CHECK(twice.output == "merged 2 stores into " + inside + ": 0 runs added, 0 updated, 4 unchanged\n");
  }
  SECTION("show, export and report read a folder of shards as one store") {
    const auto one = test::run_chiar({"show", all});
    const auto folder = test::run_chiar({"show", d.path() + "/shards"});
    const auto both = test::run_chiar({"show", s1, s2});
    REQUIRE(one.status == 0);
    CHECK(folder.output == one.output);
    CHECK(both.output == one.output);
    CHECK(test::run_chiar({"export", "--csv", d.path() + "/shards"}).output ==
          test::run_chiar({"export", "--csv", all}).output);
    const std::string claims = std::string(CHIAR_SOURCE_DIR) + "/configs/claims.toml";
    const auto report =
        test::run_chiar({"report", d.path() + "/shards", "--out", d.path() + "/r/shards", "--claims", claims});
    INFO(report.output);
    REQUIRE(report.status == 0);
    CHECK(read_text(d.path() + "/r/shards.md").find("from `2 stores: " + s1 + ", " + s2 + "`") != std::string::npos);
    // The temporary merged store is gone with the command.
    CHECK(report.output.find("chiar-view") == std::string::npos);
  }
}

TEST_CASE("merge: synthetic shard stores of a sweep merge into the whole sweep, which every store command reads",
          "[merge]") {
  // The stores chiar_store_scale measures: each run is made from its index,
  // so four shards of 10 runs hold exactly the runs of one store of 40.
  TempDir d("merge-synthetic");
  test::SyntheticStoreShape whole;
  whole.runs = 40;
  whole.seeds = 2;
  whole.steps = 200;
  whole.eval_every = 50;
  test::write_synthetic_store(d.path() + "/whole.db", whole);
  fs::create_directories(d.path() + "/shards");
  for (int64_t k = 0; k < 4; ++k) {
    test::SyntheticStoreShape shard = whole;
    shard.runs = 10;
    shard.first_run = 10 * k;
    test::write_synthetic_store(d.path() + "/shards/shard-" + std::to_string(k) + ".db", shard);
  }
  const std::string merged = d.path() + "/merged.db";
  const auto first = test::run_chiar({"merge", merged, d.path() + "/shards"});
  CHECK(first.output == "merged 4 stores into " + merged + ": 40 runs added, 0 updated, 0 unchanged\n");
  const auto again = test::run_chiar({"merge", merged, d.path() + "/shards"});
  CHECK(again.output == "merged 4 stores into " + merged + ": 0 runs added, 0 updated, 40 unchanged\n");
  for (const std::string table : {"metrics", "train_log", "flops", "routing", "histograms"}) {
    INFO(table);
    const std::string n = "SELECT COUNT(*) FROM " + table;
    CHECK(test::query_integer(merged, n) == test::query_integer(d.path() + "/whole.db", n));
    CHECK(test::query_integer(merged, n) > 0);
  }

  const auto csv = test::run_chiar({"export", "--csv", merged});
  REQUIRE(csv.status == 0);
  CHECK(csv.output == test::run_chiar({"export", "--csv", d.path() + "/whole.db"}).output);
  // Every run is listed (the failed and diverged ones too), and those that
  // finished carry a test metric.
  CHECK(std::count(csv.output.begin(), csv.output.end(), '\n') == 1 + 40);
  CHECK(test::query_integer(merged, "SELECT COUNT(*) FROM results WHERE main_metric IS NOT NULL") ==
        test::synthetic_done_runs(whole));
  CHECK(test::run_chiar({"show", merged}).status == 0);
  const std::string claims = std::string(CHIAR_SOURCE_DIR) + "/configs/claims.toml";
  const auto report = test::run_chiar({"report", merged, "--out", d.path() + "/r/sweep", "--claims", claims});
  INFO(report.output);
  REQUIRE(report.status == 0);
  const std::string md = read_text(d.path() + "/r/sweep.md");
  CHECK(md.find("## The paper's claims against this database") != std::string::npos);
  CHECK(md.find("chiar_threshold3") != std::string::npos);
}

TEST_CASE("merge: a run finished differently in two stores is a conflict, and nothing is written", "[merge]") {
  TempDir d("merge-conflict");
  write_matrix(d);
  run_two_shards(d);
  const std::string s1 = d.path() + "/shards/shard-1.db", other = d.path() + "/other.db";
  copy_file(s1, other);
  std::string name, hash, was;
  {
    engine::Database con(other);
    auto q = con.prepare(
        "SELECT r.name, r.hash, m.value, m.step FROM metrics m JOIN runs r ON r.id = m.run_id "
        "WHERE m.split = 'test' AND m.checkpoint = 'best' AND m.name = 'accuracy' ORDER BY r.name, m.step LIMIT 1");
    REQUIRE(q.step());
    name = q.text(0);
    hash = q.text(1);
    char before[40], after[40];
    std::snprintf(before, sizeof before, "%.9g", q.real(2));
    std::snprintf(after, sizeof after, "%.9g", q.real(2) + 0.5);
    was = "test best accuracy at step " + q.text(3) + " " + before + " vs " + after;
    con.prepare(
           "UPDATE metrics SET value = value + 0.5 WHERE split = 'test' AND checkpoint = 'best' AND "
           "name = 'accuracy' AND step = ? AND run_id = (SELECT id FROM runs WHERE hash = ?)")
        .bind(1, q.integer(3))
        .bind(2, hash)
        .run();
  }
  const std::string all = d.path() + "/all.db";
  SECTION("between two inputs: no output file appears") {
    const auto out = test::run_chiar({"merge", all, s1, other});
    CHECK(out.status == 2);
    CHECK(out.output == "chiar: conflict: run " + name + " (" + hash + ") finished differently in " + s1 + " and " +
                            other + ": " + was + "; nothing written\n");
    CHECK_FALSE(fs::exists(all));
  }
  SECTION("between the output and an input: the output is unchanged") {
    REQUIRE(test::run_chiar({"merge", all, s1}).status == 0);
    const std::string before = dump(all);
    const auto out = test::run_chiar({"merge", all, other});
    CHECK(out.status == 2);
    CHECK(out.output == "chiar: conflict: run " + name + " (" + hash + ") finished differently in " + all + " and " +
                            other + ": " + was + "; nothing written\n");
    CHECK(dump(all) == before);
  }
}

TEST_CASE("merge: an unfinished copy of a run gives way to the copy that got further", "[merge]") {
  TempDir d("merge-progress");
  write_matrix(d);
  run_two_shards(d);
  const std::string s1 = d.path() + "/shards/shard-1.db", partial = d.path() + "/partial.db";
  copy_file(s1, partial);
  {
    engine::Database con(partial);
    con.exec("UPDATE runs SET status = 'interrupted', step = 3");
  }
  const std::string all = d.path() + "/all.db";
  REQUIRE(test::run_chiar({"merge", all, partial}).status == 0);
  for (const auto& [name, s] : status_by_name(all)) CHECK(s == "interrupted");
  const auto out = test::run_chiar({"merge", all, s1});
  CHECK(out.output == "merged 1 store into " + all + ": 0 runs added, 2 updated, 0 unchanged\n");
  for (const auto& [name, s] : status_by_name(all)) CHECK(s == "done");
  CHECK(test::test_split_metrics(all) == test::test_split_metrics(s1));
  // The finished copy stays when the unfinished one comes again, and an
  // input holding both copies keeps the finished one.
  const std::string before = dump(all);
  CHECK(test::run_chiar({"merge", all, partial}).output ==
        "merged 1 store into " + all + ": 0 runs added, 0 updated, 2 unchanged\n");
  CHECK(dump(all) == before);
  const std::string fresh = d.path() + "/fresh.db";
  REQUIRE(test::run_chiar({"merge", fresh, partial, s1}).status == 0);
  for (const auto& [name, s] : status_by_name(fresh)) CHECK(s == "done");
}

TEST_CASE("merge: bad paths are refused before anything is written", "[merge][cli]") {
  TempDir d("merge-paths");
  write_matrix(d);
  run_two_shards(d);
  const std::string s1 = d.path() + "/shards/shard-1.db";
  // Named as an input (a folder's listing skips the output instead).
  const auto self = test::run_chiar({"merge", s1, d.path() + "/shards/shard-2.db", s1});
  CHECK(self.status == 2);
  CHECK(self.output == "chiar: " + s1 + ": the merge's output is also one of its inputs\n");
  const auto missing = test::run_chiar({"merge", d.path() + "/all.db", d.path() + "/nowhere.db"});
  CHECK(missing.status == 2);
  CHECK(missing.output == "chiar: " + d.path() + "/nowhere.db: no such database\n");
  fs::create_directories(d.path() + "/empty");
  const auto empty = test::run_chiar({"show", d.path() + "/empty"});
  CHECK(empty.status == 2);
  CHECK(empty.output == "chiar: " + d.path() + "/empty: folder holds no store (no *.db file)\n");
  CHECK_FALSE(fs::exists(d.path() + "/all.db"));
}

TEST_CASE("store: --sole-writer resumes a run that another live process seems to hold", "[merge][store]") {
  TempDir d("sole-writer");
  const std::string db = d.path() + "/s.db";
  engine::RunSpec run;
  run.matrix = "m";
  run.variant = "v";
  run.task = "t";
  run.canonical = "v/t/0";
  run.hash = "h-v-t-0";
  engine::Store store(db);
  store.register_runs({run});
  engine::Provenance alive;
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  alive.host = host;
  alive.pid = getpid();  // this process: alive
  REQUIRE(store.claim(run, alive) == engine::ClaimOutcome::Claimed);
  bool resumed = false;
  CHECK(store.claim(run, alive, &resumed) == engine::ClaimOutcome::Busy);
  CHECK(store.claim(run, alive, &resumed, true) == engine::ClaimOutcome::Claimed);
  CHECK(resumed);
}

TEST_CASE("slurm: the job array's sbatch script, exactly", "[slurm_script]") {
  engine::SlurmJob job;
  job.name = "abl";
  job.chiar = "/opt/chiar/bin/chiar";
  job.matrix = "/home/r/abl.toml";
  job.dir = "/scratch/r/results/abl";
  job.workdir = "/home/r";
  job.data_root = "/data";
  job.cache_dir = "/home/r/.cache";
  job.set = {"train.steps=10", "task.note=it's"};
  job.options.tasks = 4;
  job.options.partition = "cpu";
  job.options.time = "2:00:00";
  job.options.cpus_per_task = 8;
  job.options.mem = "16G";
  job.options.extra = {"#SBATCH --qos=low"};
  CHECK(engine::sbatch_script(job) == R"(#!/bin/bash
# Written by `chiar slurm`: matrix 'abl' as a job array of 4 tasks.
# Task i runs a deterministic 1/4 of the matrix (--shard i/4) into its own store,
# shard-i.db beside this script. Once the tasks end, combine the shards:
#   chiar merge '/scratch/r/results/abl/merged.db' '/scratch/r/results/abl'
# A preempted, requeued or resubmitted task resumes its runs from their checkpoints
# (--sole-writer: no other process writes its store). Submit with sbatch, or `chiar slurm --submit`.
#SBATCH --job-name='chiar-abl'
#SBATCH --array=1-4
#SBATCH --output='/scratch/r/results/abl/logs/%A_%a.out'
#SBATCH --chdir='/home/r'
#SBATCH --ntasks=1
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --partition=cpu
#SBATCH --time=2:00:00
#SBATCH --signal=B:TERM@120
#SBATCH --cpus-per-task=8
#SBATCH --mem=16G
#SBATCH --qos=low

set -euo pipefail
shard="${SLURM_ARRAY_TASK_ID:?run this script with sbatch (a job array)}"
echo "chiar-abl: array task ${shard}/4, job ${SLURM_JOB_ID:-?}, on $(hostname), restart ${SLURM_RESTART_COUNT:-0}"
exec '/opt/chiar/bin/chiar' run '/home/r/abl.toml' \
  --shard "${shard}/4" \
  --db '/scratch/r/results/abl'/shard-"${shard}".db \
  --sole-writer \
  --data-root '/data' \
  --cache-dir '/home/r/.cache' \
  --threads 8 \
  --set 'train.steps=10' \
  --set 'task.note=it'\''s'
)");
}

TEST_CASE("slurm: values Slurm would reject are refused, naming the option", "[slurm_script][cli]") {
  engine::SlurmJob job;
  job.name = "abl";
  job.options.tasks = 2;
  auto refusal = [&](auto change) {
    engine::SlurmJob j = job;
    change(j.options);
    try {
      engine::sbatch_script(j);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  CHECK(refusal([](auto& o) { o.time = "2h"; }) ==
        "--time: expected minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]], found '2h'");
  CHECK(refusal([](auto& o) { o.time = "1-12:00"; }) == "accepted");
  CHECK(refusal([](auto& o) { o.mem = "lots"; }) == "--mem: expected a size such as 4000, 16G or 512M, found 'lots'");
  CHECK(refusal([](auto& o) { o.partition = "cpu\n#SBATCH --x"; }) ==
        "--partition: expected partition names (letters, digits, '_', '-', '.', ','), found 'cpu\n#SBATCH --x'");
  CHECK(refusal([](auto& o) { o.extra = {"--qos=low"}; }) ==
        "--extra: expected one line starting with '#SBATCH ', found '--qos=low'");
  CHECK(refusal([](auto& o) { o.tasks = 0; }) == "--tasks: expected a number of array tasks >= 1, found 0");
  CHECK(refusal([](auto& o) { o.time = "2"; }) ==
        "--time: at least 3 minutes, found '2' (a task gets SIGTERM 2 minutes before its limit, to checkpoint)");
  CHECK(refusal([](auto& o) { o.time = "0-0:2:59"; }).rfind("--time: at least 3 minutes", 0) == 0);
  CHECK(refusal([](auto& o) { o.time = "3:00"; }) == "accepted");
  engine::SlurmJob odd = job;
  odd.name = "abl\"$(rm)";
  CHECK_THROWS_WITH(engine::sbatch_script(odd),
                    "matrix name: expected letters, digits, '_', '-', '.' or '+' for a Slurm job name (set [matrix] "
                    "name), found 'abl\"$(rm)'");
}

TEST_CASE("slurm: chiar slurm writes a script whose tasks run their shards without Slurm too", "[slurm_script][cli]") {
  TempDir d("slurm-script");
  write_matrix(d);
  const std::string out = d.path() + "/out";
  const std::vector<std::string> base = {"slurm",       d.path() + "/m.toml", "--dir", out, "--data-root", d.path(),
                                         "--cache-dir", d.path() + "/cache"};
  auto too_many = base;
  too_many.insert(too_many.end(), {"--tasks", "5"});
  const auto refused = test::run_chiar(too_many);
  CHECK(refused.status == 2);
  CHECK(refused.output ==
        "chiar: --tasks 5: the matrix has 4 runs; more array tasks than runs would leave some with nothing to do\n");
  CHECK_FALSE(fs::exists(out));
  // What every array task would refuse is refused before the script is written.
  auto unknown = base;
  unknown.insert(unknown.end(), {"--tasks", "2", "--set", "model.layers=[\"atn\"]"});
  const auto unknown_operator = test::run_chiar(unknown);
  CHECK(unknown_operator.status == 2);
  CHECK_THAT(unknown_operator.output, Catch::Matchers::EndsWith("unknown operator 'atn' (known: attention (attn), dct, "
                                                                "fourier, rbf)\n"));
  unknown = base;
  unknown.insert(unknown.end(), {"--tasks", "2", "--set", "task.n_trian=8"});
  const auto unknown_option = test::run_chiar(unknown);
  CHECK(unknown_option.status == 2);
  CHECK_THAT(unknown_option.output, Catch::Matchers::StartsWith("chiar: --set task.n_trian: unknown option of task"));
  CHECK_FALSE(fs::exists(out));

  auto args = base;
  args.insert(args.end(), {"--tasks", "2"});
  const auto wrote = test::run_chiar(args);
  INFO(wrote.output);
  REQUIRE(wrote.status == 0);
  const std::string script = out + "/slurm.sbatch";
  REQUIRE(fs::exists(script));
  CHECK(fs::is_directory(out + "/logs"));
  CHECK(wrote.output.rfind(read_text(script), 0) == 0);  // printed for review
  // Each array task, run by hand as Slurm would (SLURM_ARRAY_TASK_ID set).
  for (const std::string k : {"1", "2"}) {
    const int rc = std::system(("cd '" + d.path() + "' && SLURM_ARRAY_TASK_ID=" + k + " bash '" + script + "' > '" +
                                d.path() + "/task-" + k + ".log' 2>&1")
                                   .c_str());
    INFO(read_text(d.path() + "/task-" + k + ".log"));
    REQUIRE(rc == 0);
  }
  const std::string merged = d.path() + "/merged.db";
  REQUIRE(test::run_chiar({"merge", merged, out}).status == 0);
  CHECK(status_by_name(merged).size() == 4);
  for (const auto& [name, s] : status_by_name(merged)) CHECK(s == "done");

  // Submitting where there is no Slurm: the environment's failure, the script kept.
  const char* path = std::getenv("PATH");
  const std::string saved = path ? path : "";
  setenv("PATH", "/nonexistent", 1);
  auto submit = args;
  submit.push_back("--submit");
  const auto no_slurm = test::run_chiar(submit);
  setenv("PATH", saved.c_str(), 1);
  CHECK(no_slurm.status == 3);
  CHECK(no_slurm.output ==
        "chiar: sbatch: not found on PATH (is this a Slurm submit host?); the script is " + script + "\n");
  CHECK(fs::exists(script));
}

TEST_CASE("slurm: --retry-failed starts the shards' failed runs again, once, before the job", "[slurm_script][cli]") {
  TempDir d("slurm-retry");
  write_matrix(d);
  const std::string out = d.path() + "/out", script = out + "/slurm.sbatch";
  const std::vector<std::string> args = {"slurm",       d.path() + "/m.toml", "--dir",   out, "--data-root", d.path(),
                                         "--cache-dir", d.path() + "/cache",  "--tasks", "2"};
  REQUIRE(test::run_chiar(args).status == 0);
  // Array task K as Slurm would start it, with `env` (VAR=value ...) set.
  const auto array_task = [&](const std::string& k, const std::string& env) {
    const std::string log = d.path() + "/task-" + k + ".log";
    const int rc = std::system(("cd '" + d.path() + "' && env " + env + " SLURM_ARRAY_TASK_ID=" + k + " bash '" +
                                script + "' > '" + log + "' 2>&1")
                                   .c_str());
    return test::Finished{WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, read_text(log)};
  };
  // Task 1's first run fails (a plugin's bug, say); the other runs finish.
  const auto failing = array_task("1", "CHIAR_FAILPOINT=train.step:2:throw");
  INFO(failing.output);
  REQUIRE(failing.status == 1);
  const auto task2 = array_task("2", "");
  INFO(task2.output);
  REQUIRE(task2.status == 0);
  const std::string shard1 = out + "/shard-1.db";
  std::string failed;
  for (const auto& [name, status] : status_by_name(shard1))
    if (status == "failed") failed = name;
  REQUIRE_FALSE(failed.empty());
  // The tasks themselves never retry: a task Slurm requeues would retry a
  // deterministic failure each time.
  const std::string script_text = read_text(script);
  CHECK(script_text.find("--retry-failed") == std::string::npos);

  auto retry = args;
  retry.push_back("--retry-failed");
  // Every shard store is checked before anything is written: a file that is
  // not a store among them refuses the whole command.
  const std::string foreign = out + "/shard-9.db";
  std::ofstream(foreign) << "not a database\n";
  fs::remove(script);
  const auto refused = test::run_chiar(retry);
  INFO(refused.output);
  CHECK(refused.status == 2);
  CHECK(refused.output.rfind("chiar: " + foreign + ": ", 0) == 0);
  CHECK_FALSE(fs::exists(script));
  CHECK(status_by_name(shard1).at(failed) == "failed");
  fs::remove(foreign);

  const auto retried = test::run_chiar(retry);
  INFO(retried.output);
  REQUIRE(retried.status == 0);
  CHECK(test::has_line(retried.output, "retrying 1 failed run from the start (their records in " + shard1 +
                                           " are replaced): " + failed));
  CHECK(read_text(script) == script_text);
  CHECK(status_by_name(shard1).at(failed) == "pending");

  const auto rerun = array_task("1", "");
  INFO(rerun.output);
  REQUIRE(rerun.status == 0);
  CHECK(rerun.output.find(failed + ": starting") != std::string::npos);
  const std::string merged = d.path() + "/merged.db";
  REQUIRE(test::run_chiar({"merge", merged, out}).status == 0);
  CHECK(status_by_name(merged).size() == 4);
  for (const auto& [name, s] : status_by_name(merged)) CHECK(s == "done");

  // Nothing left to retry: said, and nothing changes.
  const auto again = test::run_chiar(retry);
  INFO(again.output);
  CHECK(again.status == 0);
  CHECK(test::has_line(again.output, "--retry-failed: no run of the matrix is recorded failed in " + out));
}
