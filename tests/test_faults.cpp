// Fault injection: kill -9 at seeded points and resume, a disk that fills
// while a checkpoint is written, a read-only store folder, four processes on
// one store, a run whose loss turns NaN and one that runs out of memory.
// Every case drives the CLI as a user would and checks what the store holds
// afterwards. The tmpfs cases need root; elsewhere they skip visibly
// (CHIAR_SKIP).
#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <utility>

#include <boost/filesystem.hpp>

#include "engine/store/sqlite.h"
#include "support/env_scope.h"
#include "support/faults.h"
#include "support/process.h"
#include "support/skip.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::has_line;
using test::TempDir;
namespace fs = boost::filesystem;

namespace {

const std::vector<std::string> kWords = {"a",  "disk",    "fills", "while", "the", "store",
                                         "is", "written", "and",   "then",  "it",  "resumes"};

// The [model] and [train] tables every matrix here shares: tiny runs, one
// thread, a progress line (and store heartbeat) after every step.
std::string tiny_tables(int64_t d_model, int64_t steps, int64_t eval_every, int64_t checkpoint_every) {
  return "[model]\nd_model = " + std::to_string(d_model) + "\nn_heads = 2\n\n[train]\n" +
         test::tiny_train_body(steps, eval_every, checkpoint_every) + "log_every = 1\n\n";
}

// A word corpus under d and d/m.toml: variants base (attention) and routed
// (dct | attention) on the lm task, seed 0, with the given tables; base_steps
// > 0 gives the base run that many steps instead.
void write_matrix(const TempDir& d, const std::string& name, const std::string& tables, int64_t base_steps = 0) {
  const std::string base_train =
      base_steps > 0 ? "\n[variants.base.train]\nsteps = " + std::to_string(base_steps) + "\n" : "";
  test::write_word_corpus(d, kWords, 21, 300, 60);
  d.write("m.toml", "[matrix]\nname = \"" + name + "\"\nvariants = [\"base\", \"routed\"]\ntasks = [\"lm\"]\n" +
                        "seeds = [0]\n\n" + tables + "\n" + test::kTinyBaseVariant + base_train + "\n" +
                        test::kTinyRoutedVariant + "\n" + test::kTinyLmTask);
}

const std::vector<std::string> kRunNames = {"base/lm/seed=0", "routed/lm/seed=0"};

// `chiar run` of d/m.toml into `db`, with the GEMM library pinned: a run and
// its resumptions in separate processes then agree bit for bit (with
// "auto", each process times the libraries and may pick another).
std::vector<std::string> run_args(const TempDir& d, const std::string& db, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {"--gemm", "blas",        "run",    d.path() + "/m.toml", "--db",
                                   db,       "--data-root", d.path(), "--cache-dir",        d.path() + "/cache"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// run_args's `chiar run` with CHIAR_FAILPOINT=`point` (failpoint.h).
test::Finished run_with_failpoint(const TempDir& d, const std::string& db, const std::string& point) {
  test::EnvScope failpoint("CHIAR_FAILPOINT", point);
  return test::run_chiar(run_args(d, db));
}

// An uninterrupted `chiar run` of d/m.toml into d/reference.db, whose path
// it returns: what a faulted store must end equal to.
std::string run_reference(const TempDir& d) {
  const std::string db = d.path() + "/reference.db";
  const auto uninterrupted = test::run_chiar(run_args(d, db));
  INFO(uninterrupted.output);
  REQUIRE(uninterrupted.status == 0);
  return db;
}

// Opened read-only: the checks below must not be what repairs a store.
int64_t count(const std::string& db, const std::string& sql) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(sql);
  return q.step() ? q.integer(0) : -1;
}

std::string text_of(const std::string& db, const std::string& sql) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare(sql);
  return q.step() && !q.is_null(0) ? q.text(0) : "";
}

// The test split's metrics of one run, best and last, in a fixed order.
std::vector<double> final_metrics(const std::string& db, const std::string& run) {
  return test::test_split_metrics(db, run);
}

std::map<std::string, std::vector<double>> all_final_metrics(const std::string& db) {
  std::map<std::string, std::vector<double>> out;
  for (const auto& name : kRunNames) out[name] = final_metrics(db, name);
  return out;
}

// ---- kill -9 at seeded points -------------------------------------------

// Where an attempt dies: the n-th pass of a failpoint, or (failpoint empty)
// a SIGKILL sent from here once the child has recorded n training steps.
struct KillPoint {
  std::string failpoint;
  int64_t n = 1;

  std::string describe() const {
    return failpoint.empty() ? "SIGKILL from outside after " + std::to_string(n) + " steps"
                             : "CHIAR_FAILPOINT=" + failpoint + ":" + std::to_string(n);
  }
};

// The kinds of point and the largest n drawn for each. The bounds keep each
// attempt's progress to a few steps (a step commits its train log and
// heartbeat, a checkpoint falls every 2 steps, an evaluation every 3), so
// the ten attempts of the test below stay well inside its matrix of 6 + 24
// steps (they end about 9 steps into the second run) and every one is killed.
struct PointKind {
  const char* failpoint;
  int64_t max_n;
};
const std::vector<PointKind> kPointKinds = {
    {"train.step", 5},         {"eval.scored", 2},   {"checkpoint.written", 2},
    {"checkpoint.renamed", 2}, {"store.commit", 10}, {"", 5},
};

// `kills` points: every kind once, then kinds drawn at random, in a shuffled
// order, each with a random n.
std::vector<KillPoint> plan_kills(std::mt19937& rng, size_t kills) {
  std::vector<size_t> kinds;
  for (size_t k = 0; k < kPointKinds.size() && kinds.size() < kills; ++k) kinds.push_back(k);
  std::uniform_int_distribution<size_t> any_kind(0, kPointKinds.size() - 1);
  while (kinds.size() < kills) kinds.push_back(any_kind(rng));
  std::shuffle(kinds.begin(), kinds.end(), rng);
  std::vector<KillPoint> plan;
  for (size_t k : kinds) {
    std::uniform_int_distribution<int64_t> n(1, kPointKinds[k].max_n);
    plan.push_back({kPointKinds[k].failpoint, n(rng)});
  }
  return plan;
}

// Sends SIGKILL once the child's log shows `steps` progress lines (each
// printed after its step's heartbeat is committed to the store) and returns
// its status; or the status it exited with before that.
int kill_after_steps(pid_t pid, const std::string& log, int64_t steps) {
  int status = 0;
  // A hang guard only (about 5 minutes): a working child dies or exits long before.
  for (int poll = 0; poll < 300000; ++poll) {
    if (test::child_exited(pid, &status)) return status;
    if (static_cast<int64_t>(test::occurrences(test::read_text(log), "  step ")) >= steps) {
      kill(pid, SIGKILL);
      return test::wait_chiar(pid);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGKILL);
  test::wait_chiar(pid);
  return -1;
}

// One attempt under `point`: the child's status, its output appended to *logs.
int attempt(const std::vector<std::string>& args, const KillPoint& point, const std::string& log, std::string* logs) {
  int status = 0;
  if (point.failpoint.empty()) {
    status = kill_after_steps(test::spawn_chiar_with_env(args, log, {}), log, point.n);
  } else {
    const std::string env = "CHIAR_FAILPOINT=" + point.failpoint + ":" + std::to_string(point.n);
    status = test::wait_chiar(test::spawn_chiar_with_env(args, log, {env}));
  }
  *logs += test::read_text(log);
  return status;
}

// Whether the logs (in order) show the run trained again after it was done.
bool trained_after_done(const std::string& logs, const std::string& run) {
  const size_t done = logs.find(run + ": done in");
  if (done == std::string::npos) return false;
  return logs.find(run + ": resuming", done) != std::string::npos ||
         logs.find(run + ": starting", done) != std::string::npos;
}

// ---- tmpfs ---------------------------------------------------------------

// Every file under a folder with its bytes: what a read-only folder must
// still hold after the commands.
std::map<std::string, std::string> snapshot(const std::string& folder) {
  std::map<std::string, std::string> files;
  for (fs::recursive_directory_iterator it(folder), end; it != end; ++it)
    if (fs::is_regular_file(it->path())) files[it->path().string()] = test::read_text(it->path().string());
  return files;
}

// The marks of a crash or a libtorch error reaching the user.
void check_no_crash_text(const std::string& output) {
  CHECK(output.find("terminate called") == std::string::npos);
  CHECK(output.find("c10::Error") == std::string::npos);
  CHECK(output.find("Exception raised from") == std::string::npos);
  CHECK(output.find("frame #") == std::string::npos);
}

}  // namespace

TEST_CASE("faults: kill -9 at 10 seeded points, resume each time", "[faults]") {
  TempDir d("faults-kill");
  // A short base run, so that kills land in its end (last evaluation, test
  // split, finish) and in the routed run after it.
  write_matrix(d, "kills", tiny_tables(16, 24, 3, 2), 6);
  const auto reference = all_final_metrics(run_reference(d));
  for (const auto& [run, metrics] : reference) REQUIRE(metrics.size() >= 4);  // best and last, 2+ metrics each

  std::mt19937 rng(20240521);
  const std::vector<KillPoint> plan = plan_kills(rng, 10);
  std::string planned;
  for (size_t i = 0; i < plan.size(); ++i) planned += "\n  " + std::to_string(i + 1) + ": " + plan[i].describe();
  INFO("kill points:" << planned);

  const std::string db = d.path() + "/killed.db";
  const auto args = run_args(d, db);
  std::string logs;
  for (size_t i = 0; i < plan.size(); ++i) {
    const std::string log = d.path() + "/attempt-" + std::to_string(i + 1) + ".txt";
    const int status = attempt(args, plan[i], log, &logs);
    INFO("attempt " << (i + 1) << ", " << plan[i].describe() << ":\n" << test::read_text(log));
    REQUIRE(status == 128 + SIGKILL);
    REQUIRE(test::integrity_check(db) == "ok");
    CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") < 2);
  }

  const auto last = test::run_chiar(args);
  logs += last.output;
  INFO(last.output);
  REQUIRE(last.status == 0);
  CHECK(test::integrity_check(db) == "ok");
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 2);
  CHECK(all_final_metrics(db) == reference);
  // Each run started once, finished once and was never trained again.
  for (const auto& run : kRunNames) {
    INFO(run);
    CHECK(test::occurrences(logs, run + ": starting") == 1);
    CHECK(test::occurrences(logs, run + ": done in") == 1);
    CHECK_FALSE(trained_after_done(logs, run));
  }
}

TEST_CASE("faults: a full disk while checkpointing exits 3 and resumes once space is freed", "[faults]") {
  if (!test::TmpfsMount::available()) CHIAR_SKIP("[faults]", "needs root to mount a tmpfs");
  TempDir d("faults-full");
  // d_model 128: the model alone (the first checkpoint written, the best at
  // step 3) takes 1.6 MB, the store 0.1 MB (measured): a 1 MiB disk holds the
  // store and its WAL, never a checkpoint.
  write_matrix(d, "full", tiny_tables(128, 6, 3, 3));
  const std::vector<std::string> one = {"--only", "base/lm/seed=0"};
  const auto uninterrupted = test::run_chiar(run_args(d, d.path() + "/reference.db", one));
  INFO(uninterrupted.output);
  REQUIRE(uninterrupted.status == 0);
  const auto reference = final_metrics(d.path() + "/reference.db", "base/lm/seed=0");
  REQUIRE_FALSE(reference.empty());

  const std::string folder = d.path() + "/store";
  fs::create_directories(folder);
  test::TmpfsMount disk(folder, 1 << 20);
  const std::string db = folder + "/full.db";
  const auto full = test::run_chiar(run_args(d, db, one));
  INFO(full.output);
  CHECK(full.status == 3);
  // One message naming the file that did not fit and the cause: the best
  // model of step 3, the first checkpoint written.
  const std::string message = folder + "/full.db.checkpoints/" + text_of(db, "SELECT hash FROM runs") +
                              "/best-3.pt.tmp: cannot write the checkpoint: No space left on device";
  CHECK(has_line(full.output, "chiar: " + message));
  CHECK(test::occurrences(full.output, "No space left on device") == 1);
  check_no_crash_text(full.output);
  CHECK(test::integrity_check(db) == "ok");
  CHECK(text_of(db, "SELECT status FROM runs") == "interrupted");
  CHECK_THAT(text_of(db, "SELECT error FROM runs"), Catch::Matchers::Contains(message));

  disk.resize(64 << 20);
  const auto resumed = test::run_chiar(run_args(d, db, one));
  INFO(resumed.output);
  REQUIRE(resumed.status == 0);
  CHECK(test::integrity_check(db) == "ok");
  CHECK(text_of(db, "SELECT status FROM runs") == "done");
  CHECK(final_metrics(db, "base/lm/seed=0") == reference);
}

TEST_CASE("faults: a read-only store folder", "[faults]") {
  if (!test::TmpfsMount::available()) CHIAR_SKIP("[faults]", "needs root to mount a tmpfs");
  TempDir d("faults-ro");
  write_matrix(d, "readonly", tiny_tables(16, 6, 3, 3));
  const std::string folder = d.path() + "/store";
  fs::create_directories(folder);
  test::TmpfsMount disk(folder, 16 << 20);
  const std::string db = folder + "/ro.db";
  // One run finished, the other not yet started.
  const auto first = test::run_chiar(run_args(d, db, {"--only", "base/lm/seed=0"}));
  INFO(first.output);
  REQUIRE(first.status == 0);
  disk.make_read_only();
  const auto before = snapshot(folder);

  const auto shown = test::run_chiar({"show", db});
  INFO(shown.output);
  CHECK(shown.status == 0);
  CHECK_THAT(shown.output, Catch::Matchers::Contains("base/lm/seed=0"));
  const std::string report = d.path() + "/elsewhere/report";
  const auto reported = test::run_chiar({"report", db, "--out", report});
  INFO(reported.output);
  CHECK(reported.status == 0);
  CHECK(fs::exists(report + ".md"));
  CHECK(fs::exists(report + ".html"));

  const auto ran = test::run_chiar(run_args(d, db));
  INFO(ran.output);
  CHECK(ran.status == 3);
  CHECK(has_line(ran.output, "chiar: " + db + ": opening the database for writing: Read-only file system"));
  CHECK(test::occurrences(ran.output, "Read-only file system") == 1);
  check_no_crash_text(ran.output);
  CHECK(snapshot(folder) == before);
  CHECK(test::integrity_check(db) == "ok");
}

TEST_CASE("faults: 4 concurrent processes on one store run each run exactly once", "[faults]") {
  TempDir d("faults-four");
  test::write_word_corpus(d, kWords, 23, 300, 60);
  // 8 runs: 2 variants x 2 tasks x 2 seeds.
  d.write("m.toml",
          "[matrix]\nname = \"four\"\nvariants = [\"base\", \"routed\"]\ntasks = [\"lm\", \"flat\"]\n"
          "seeds = [0, 1]\n\n" +
              tiny_tables(16, 6, 3, 3) + "\n" + test::kTinyBaseVariant + "\n" + test::kTinyRoutedVariant + "\n" +
              test::kTinyFlatTask + "\n" + test::kTinyLmTask);
  const std::string db = d.path() + "/four.db";
  std::vector<pid_t> children;
  for (int i = 0; i < 4; ++i)
    children.push_back(test::spawn_chiar(run_args(d, db), d.path() + "/p" + std::to_string(i) + ".txt"));
  std::vector<int> statuses;
  for (pid_t pid : children) statuses.push_back(test::wait_chiar(pid));
  std::string logs;
  for (int i = 0; i < 4; ++i) logs += test::read_text(d.path() + "/p" + std::to_string(i) + ".txt");
  INFO(logs);
  CHECK(statuses == std::vector<int>(4, 0));
  CHECK(logs.find("database is locked") == std::string::npos);
  CHECK(logs.find("resuming") == std::string::npos);  // no live run was taken for dead
  CHECK(test::occurrences(logs, ": starting") == 8);
  CHECK(test::occurrences(logs, ": done in") == 8);
  // Every process went through the whole matrix: what it ran plus what it
  // skipped is 8, and the four ran 8 between them. A process that starts
  // after the others finished everything says so in its own words.
  const std::regex tally("matrix 'four': (?:(\\d+) run, (\\d+) skipped|all (\\d+) runs finished before)");
  int64_t ran = 0, tallies = 0;
  for (std::sregex_iterator it(logs.begin(), logs.end(), tally), end; it != end; ++it) {
    ++tallies;
    if ((*it)[3].matched) {
      CHECK(std::stoll((*it)[3]) == 8);
      continue;
    }
    ran += std::stoll((*it)[1]);
    CHECK(std::stoll((*it)[1]) + std::stoll((*it)[2]) == 8);
  }
  CHECK(tallies == 4);
  CHECK(ran == 8);
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 8);
  CHECK(count(db, "SELECT COUNT(*) FROM runs") == 8);
  CHECK(test::integrity_check(db) == "ok");
}

TEST_CASE("faults: a stop during an evaluation ends it between batches; reruns finish as if never stopped",
          "[faults]") {
  TempDir d("faults-evalstop");
  write_matrix(d, "evalstop", tiny_tables(16, 6, 3, 3));
  const auto reference = all_final_metrics(run_reference(d));

  // Attempt k sends itself SIGTERM (what scancel and Ctrl-C send) after the
  // k-th evaluation batch of its process; each rerun resumes from the last
  // checkpoint, so as k grows the stops walk through every validation and
  // both passes over the test split of both runs. A stop after an
  // evaluation's last batch lets that evaluation count.
  const std::string db = d.path() + "/stopped.db";
  const auto args = run_args(d, db);
  int in_validation = 0, in_test_split = 0;
  bool finished = false;
  for (int k = 1; k <= 80 && !finished; ++k) {
    const std::string log = d.path() + "/attempt-" + std::to_string(k) + ".txt";
    const int status = test::wait_chiar(
        test::spawn_chiar_with_env(args, log, {"CHIAR_FAILPOINT=eval.batch:" + std::to_string(k) + ":term"}));
    const std::string output = test::read_text(log);
    INFO("attempt " << k << ":\n" << output);
    check_no_crash_text(output);
    REQUIRE(test::integrity_check(db) == "ok");
    CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'interrupted'") <= 1);
    finished = count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 2;
    REQUIRE((status == 0 || status == 130));
    in_validation += static_cast<int>(test::occurrences(output, ": interrupted; stopped while validating step "));
    in_test_split += static_cast<int>(
        test::occurrences(output, ": interrupted; stopped while scoring the test split, rerun to score it"));
  }
  REQUIRE(finished);
  CHECK(in_validation >= 2);
  CHECK(in_test_split >= 2);
  CHECK(all_final_metrics(db) == reference);
  // Stopped runs keep the step times their training measured.
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE step_ms > 0 AND train_tokens_per_s > 0") == 2);
}

TEST_CASE("faults: NaN injected mid-run -> diverged, the matrix goes on", "[faults]") {
  TempDir d("faults-nan");
  test::write_word_corpus(d, kWords, 25, 300, 60);
  // The poisoned run comes first, so the base run shows that the matrix goes on.
  d.write("m.toml",
          "[matrix]\nname = \"nan\"\nvariants = [\"poisoned\", \"base\"]\ntasks = [\"lm\"]\n"
          "seeds = [0]\n\n" +
              tiny_tables(16, 8, 4, 4) + R"(
[variants.poisoned]
layers = ["dct", "nan_at"]
operators = { nan_at = { call = 5 } }

)" + test::kTinyBaseVariant +
              "\n" + test::kTinyLmTask);
  const std::string db = d.path() + "/nan.db";
  std::vector<std::string> args = run_args(d, db);
  args.insert(args.begin(), {"--plugin-dir", std::string(CHIAR_TEST_PLUGIN_DIR) + "/nan_at"});
  const auto r = test::run_chiar(args);
  INFO(r.output);
  CHECK(r.status == 0);  // a diverged run is a finished run
  CHECK_THAT(r.output, Catch::Matchers::Contains("poisoned/lm/seed=0: diverged (loss "));
  CHECK_THAT(r.output, Catch::Matchers::Contains("base/lm/seed=0: done in"));
  CHECK_THAT(r.output, Catch::Matchers::Contains("matrix 'nan': 2 run, 0 skipped"));
  // The 5th training forward is step 5's: the loss of step 5 is NaN.
  CHECK(count(db,
              "SELECT COUNT(*) FROM runs WHERE name = 'poisoned/lm/seed=0' AND status = 'diverged' AND "
              "diverged_step = 5 AND error LIKE 'loss %nan at step 5'") == 1);
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE name = 'base/lm/seed=0' AND status = 'done'") == 1);
  CHECK(count(db,
              "SELECT COUNT(*) FROM metrics m JOIN runs r ON r.id = m.run_id WHERE "
              "r.name = 'base/lm/seed=0' AND m.split = 'test'") > 0);
  // A second run leaves both alone: diverged is final.
  const auto again = test::run_chiar(args);
  INFO(again.output);
  CHECK(again.status == 0);
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status IN ('diverged', 'done')") == 2);
}

TEST_CASE("faults: out of memory mid-run -> interrupted, the matrix goes on, exit 3, resumes", "[faults]") {
  TempDir d("faults-oom");
  write_matrix(d, "oom", tiny_tables(16, 6, 3, 3));
  const auto reference = all_final_metrics(run_reference(d));

  // The exception libtorch's CUDA allocator throws, after step 4's update in
  // the first run (base), before the step is recorded; its last checkpoint
  // is step 3's.
  const std::string db = d.path() + "/oom.db";
  const auto oom = run_with_failpoint(d, db, "train.step:4:oom");
  INFO(oom.output);
  CHECK(oom.status == 3);
  const std::string cause =
      "out of memory on cpu: out of memory at failpoint train.step (CHIAR_FAILPOINT asked for it)";
  CHECK(has_line(oom.output, "[1/2] base/lm/seed=0: " + cause));
  CHECK(has_line(oom.output, "[1/2] base/lm/seed=0: recorded interrupted, to resume on a device with more memory"));
  // The matrix went on: the routed run fits, and finished.
  CHECK_THAT(oom.output, Catch::Matchers::Contains("routed/lm/seed=0: done in"));
  CHECK_THAT(oom.output,
             Catch::Matchers::Contains("matrix 'oom': 2 run, 0 skipped, 1 out of memory; results in " + db));
  CHECK(has_line(oom.output, "chiar: " + db +
                                 ": 1 run ran out of memory and is recorded interrupted: rerun on a device with more "
                                 "memory to resume it, or lower train.batch (a new run)"));
  check_no_crash_text(oom.output);
  CHECK(text_of(db, "SELECT status || ' at ' || step || ': ' || error FROM runs WHERE name = 'base/lm/seed=0'") ==
        "interrupted at 3: " + cause);
  CHECK(text_of(db, "SELECT status FROM runs WHERE name = 'routed/lm/seed=0'") == "done");

  // Rerun (the memory is there now): the run resumes from step 3's checkpoint
  // and ends as if it had never stopped.
  const auto resumed = test::run_chiar(run_args(d, db));
  INFO(resumed.output);
  REQUIRE(resumed.status == 0);
  CHECK_THAT(resumed.output, Catch::Matchers::Contains("base/lm/seed=0: resuming"));
  CHECK_THAT(resumed.output, Catch::Matchers::Contains("routed/lm/seed=0: finished before, skipped"));
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done' AND error IS NULL") == 2);
  CHECK(all_final_metrics(db) == reference);
}

TEST_CASE("faults: a failed run is skipped until --retry-failed starts it again, as new", "[faults]") {
  TempDir d("faults-retry");
  write_matrix(d, "retry", tiny_tables(16, 6, 3, 3));
  const std::string reference_db = run_reference(d);

  // The second run (routed: it records routing shares and histograms too)
  // fails after its step 4's update, with a checkpoint and a validation of
  // step 3 recorded; the first took the failpoint's first 6 passes.
  const std::string db = d.path() + "/retry.db";
  const auto failed = run_with_failpoint(d, db, "train.step:10:throw");
  INFO(failed.output);
  CHECK(failed.status == 1);
  CHECK(has_line(failed.output,
                 "[2/2] routed/lm/seed=0: failed: failure at failpoint train.step (CHIAR_FAILPOINT asked for it)"));
  CHECK(text_of(db, "SELECT status FROM runs WHERE name = 'routed/lm/seed=0'") == "failed");
  CHECK(count(db,
              "SELECT COUNT(*) FROM checkpoints c JOIN runs r ON r.id = c.run_id "
              "WHERE r.name = 'routed/lm/seed=0'") > 0);
  CHECK(count(db,
              "SELECT COUNT(*) FROM histograms h JOIN runs r ON r.id = h.run_id "
              "WHERE r.name = 'routed/lm/seed=0'") > 0);

  // Failed is final: a rerun skips it.
  const auto again = test::run_chiar(run_args(d, db));
  INFO(again.output);
  CHECK(again.status == 0);
  CHECK_THAT(again.output, Catch::Matchers::Contains("matrix 'retry': all 2 runs finished before"));
  const auto dry = test::run_chiar(run_args(d, db, {"--dry-run", "--retry-failed"}));
  INFO(dry.output);
  CHECK(dry.status == 0);
  CHECK_THAT(dry.output, Catch::Matchers::Contains("run       failed      routed/lm/seed=0"));
  CHECK_THAT(dry.output, Catch::Matchers::Contains("skip      done        base/lm/seed=0"));

  // Retried, it starts from nothing: its checkpoints are discarded, and its
  // record ends as the uninterrupted run's, log and metrics bit for bit.
  const auto retried = test::run_chiar(run_args(d, db, {"--retry-failed"}));
  INFO(retried.output);
  REQUIRE(retried.status == 0);
  CHECK(has_line(retried.output,
                 "retrying 1 failed run from the start (their records in " + db + " are replaced): routed/lm/seed=0"));
  CHECK_THAT(retried.output, Catch::Matchers::Contains("[2/2] routed/lm/seed=0: starting"));
  CHECK_THAT(retried.output, Catch::Matchers::Contains("[2/2] routed/lm/seed=0: discarded checkpoints in"));
  CHECK_THAT(retried.output, Catch::Matchers::Contains("[1/2] base/lm/seed=0: finished before, skipped"));
  CHECK(test::integrity_check(db) == "ok");
  CHECK(count(db, "SELECT COUNT(*) FROM runs WHERE status = 'done' AND error IS NULL") == 2);
  // The run's record is the uninterrupted run's, table by table: nothing of
  // the failed attempt is left (SQLite may give the new row the old id).
  for (const std::string table :
       {"metrics", "train_log", "flops", "flops_reference", "routing", "histograms", "checkpoints"}) {
    INFO(table);
    const std::string rows = "SELECT COUNT(*) FROM " + table +
                             " t JOIN runs r ON r.id = t.run_id "
                             "WHERE r.name = 'routed/lm/seed=0'";
    CHECK(count(db, rows) == count(reference_db, rows));
    CHECK(count(db, "SELECT COUNT(*) FROM " + table + " WHERE run_id NOT IN (SELECT id FROM runs)") == 0);
  }
  CHECK(test::train_logs(db) == test::train_logs(reference_db));
  CHECK(all_final_metrics(db) == all_final_metrics(reference_db));
}

namespace {

// write_matrix's two runs (base, then routed; 6 steps each) under
// CHIAR_FAILPOINT=`point`, which fails base at its step 4, into
// d/<name>.db; checks that base failed, and returns the run and the store.
std::pair<test::Finished, std::string> run_failing_base(const TempDir& d, const std::string& name,
                                                        const std::string& point) {
  write_matrix(d, name, tiny_tables(16, 6, 3, 3));
  const std::string db = d.path() + "/" + name + ".db";
  auto run = run_with_failpoint(d, db, point);
  INFO(run.output);
  CHECK(has_line(run.output,
                 "[1/2] base/lm/seed=0: failed: failure at failpoint train.step (CHIAR_FAILPOINT asked for it)"));
  check_no_crash_text(run.output);
  CHECK(text_of(db, "SELECT status || ' at ' || step FROM runs WHERE name = 'base/lm/seed=0'") == "failed at 3");
  return {run, db};
}

}  // namespace

TEST_CASE("faults: one run failed and one out of memory -> both recorded, exit 3", "[faults]") {
  TempDir d("faults-fail-oom");
  // The second run (routed) runs out of memory at its step 4, the
  // failpoint's 8th pass.
  const auto [both, db] = run_failing_base(d, "failoom", "train.step:4:throw,train.step:8:oom");
  INFO(both.output);
  // Memory running out is the environment's failure: it decides the status.
  CHECK(both.status == 3);
  CHECK(has_line(both.output, "[2/2] routed/lm/seed=0: recorded interrupted, to resume on a device with more memory"));
  CHECK(has_line(both.output,
                 "matrix 'failoom': 2 run, 0 skipped, 1 failed (the error of each is above and in "
                 "runs.error), 1 out of memory; results in " +
                     db));
  CHECK(has_line(both.output, "chiar: " + db +
                                  ": 1 run ran out of memory and is recorded interrupted: rerun on a device with more "
                                  "memory to resume it, or lower train.batch (a new run)"));
  CHECK(text_of(db, "SELECT status || ' at ' || step FROM runs WHERE name = 'routed/lm/seed=0'") == "interrupted at 3");
}

TEST_CASE("faults: a stop requested as a run fails ends the command there; the next run is left pending", "[faults]") {
  TempDir d("faults-fail-stop");
  // SIGTERM (as from scancel) reaches the process at the moment base's step
  // 4 throws (the targets act in the order given).
  const auto [stopped, db] = run_failing_base(d, "failstop", "train.step:4:term,train.step:4:throw");
  INFO(stopped.output);
  CHECK(stopped.status == 130);
  // The second run is not claimed only to be interrupted at once.
  CHECK_THAT(stopped.output, !Catch::Matchers::Contains("routed/lm/seed=0"));
  CHECK(text_of(db,
                "SELECT status || ' ' || COALESCE(started_at, 'never started') FROM runs WHERE name = "
                "'routed/lm/seed=0'") == "pending never started");

  // The rerun trains the second run; the failed one stays failed.
  const auto rerun = test::run_chiar(run_args(d, db));
  INFO(rerun.output);
  CHECK(rerun.status == 0);
  CHECK_THAT(rerun.output, Catch::Matchers::Contains("[2/2] routed/lm/seed=0: starting"));
  CHECK(text_of(db, "SELECT group_concat(status, ' ') FROM (SELECT status FROM runs ORDER BY name)") == "failed done");
}
