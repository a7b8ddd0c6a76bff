// test_data_parallel: one run trained by several processes (`chiar run
// --nproc N`, c10d over Gloo on 127.0.0.1). The config names the global
// batch, so two processes train the same run as one, up to float summation
// order; a batch that does not divide is refused before any rank starts; a
// rank that dies stops the others with a message naming it, and the rerun
// resumes from rank 0's last checkpoint; so does memory running out.
#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <boost/filesystem.hpp>

#include "engine/store/sqlite.h"
#include "support/env_scope.h"
#include "support/faults.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/tiny_matrix.h"

using namespace chiar;
using test::TempDir;

namespace {

using test::query_integer;
using test::read_text;

// One thread per process, and one product library for every store: with
// "auto" each launch times both libraries at start-up, and on a busy machine
// the single process and the pair may pick different ones, which round
// differently (seen in CI: oneDNN for one, the BLAS for the other).
std::vector<std::string> run_args(const TempDir& d, const std::string& db) {
  auto args = test::tiny_run_args(d, db);
  args.insert(args.begin(), {"--gemm", "blas"});
  args.insert(args.end(), {"--threads", "1"});
  return args;
}

// (run name, step, loss) of every logged step, in order.
std::vector<std::tuple<std::string, int64_t, double>> train_log(const std::string& db) {
  engine::Database con(db, engine::OpenMode::ReadOnly);
  auto q = con.prepare("SELECT r.name, t.step, t.loss FROM train_log t JOIN runs r ON r.id = t.run_id ORDER BY 1, 2");
  std::vector<std::tuple<std::string, int64_t, double>> out;
  while (q.step()) out.emplace_back(q.text(0), q.integer(1), q.real(2));
  return out;
}

// The pids of a process's children (Linux: /proc/<pid>/task/<pid>/children).
std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> out;
  for (pid_t child; in >> child;) out.push_back(child);
  return out;
}

// The RANK a process was started with, or -1.
int rank_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  const std::string env((std::istreambuf_iterator<char>(in)), {});
  for (size_t at = 0; at < env.size();) {
    const size_t end = env.find('\0', at);
    const std::string var = env.substr(at, end - at);
    if (var.rfind("RANK=", 0) == 0) return std::stoi(var.substr(5));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return -1;
}

// One run long enough (a few seconds on two processes) to be caught mid-way.
void write_long_matrix(const TempDir& d) {
  d.write("m.toml", R"([matrix]
name = "dp_long"
variants = ["base"]
tasks = ["flat"]
seeds = [1]
[model]
d_model = 64
n_heads = 4
[train]
steps = 2000
batch_size = 32
warmup = 20
eval_every = 1000
checkpoint_every = 100
eval_batch_size = 8
calibration_batches = 1
threads = 1
[variants.base]
layers = ["attn", "attn"]
[tasks.flat]
plugin = "listops_flat"
n_train = 64
n_valid = 16
n_test = 16
)");
}

// Starts `chiar run --nproc 2` on the long matrix and returns the
// launcher's pid once rank 0 has recorded a state checkpoint.
pid_t start_long_run(const TempDir& d, const std::string& db, const std::string& log) {
  auto args = run_args(d, db);
  args.insert(args.end(), {"--nproc", "2"});
  const pid_t launcher = test::spawn_chiar(args, log);
  int64_t checkpoints = 0;
  for (int i = 0; i < 600 && checkpoints <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!boost::filesystem::exists(db)) continue;
    try {
      checkpoints = query_integer(db, "SELECT COUNT(*) FROM checkpoints WHERE kind = 'state'");
    } catch (const std::exception&) {
      // the store is being created
    }
  }
  REQUIRE(checkpoints > 0);
  return launcher;
}

// The rerun of an interrupted run resumes it, keeping its training log.
void check_rerun_resumes(const TempDir& d, const std::string& db) {
  CHECK(query_integer(db, "SELECT COUNT(*) FROM runs WHERE status = 'interrupted'") == 1);
  const int64_t logged_before = query_integer(db, "SELECT COUNT(*) FROM train_log");
  auto args = run_args(d, db);
  args.insert(args.end(), {"--nproc", "2"});
  const auto rerun = test::run_chiar(args);
  INFO(rerun.output);
  REQUIRE(rerun.status == 0);
  CHECK(rerun.output.find(": resuming (") != std::string::npos);
  CHECK(rerun.output.find(": starting (") == std::string::npos);
  CHECK(query_integer(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 1);
  CHECK(query_integer(db, "SELECT MIN(step) FROM train_log") == 10);
  CHECK(query_integer(db, "SELECT COUNT(*) FROM train_log") >= logged_before);
}

}  // namespace

TEST_CASE("data parallel: two processes train a run as one does, step by step", "[data_parallel]") {
  TempDir d("dp-equal");
  test::write_tiny_matrix(d, R"(name = "dp"
variants = ["base", "routed"]
tasks = ["lm", "flat"]
seeds = [0]
)",
                          test::tiny_train_body(20, 10, 10) + "log_every = 1\n");
  const std::string one = d.path() + "/one.db", two = d.path() + "/two.db";
  const auto single = test::run_chiar(run_args(d, one));
  INFO(single.output);
  REQUIRE(single.status == 0);
  auto args = run_args(d, two);
  args.insert(args.end(), {"--nproc", "2"});
  const auto pair = test::run_chiar(args);
  INFO(pair.output);
  REQUIRE(pair.status == 0);

  const auto a = train_log(one), b = train_log(two);
  REQUIRE(a.size() == 4 * 20);
  REQUIRE(b.size() == a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(std::get<0>(a[i]) << " step " << std::get<1>(a[i]));
    CHECK(std::get<0>(b[i]) == std::get<0>(a[i]));
    CHECK(std::get<1>(b[i]) == std::get<1>(a[i]));
    CHECK(std::get<2>(b[i]) == Approx(std::get<2>(a[i])).epsilon(1e-5));
  }
  const auto ma = test::test_split_metrics(one), mb = test::test_split_metrics(two);
  REQUIRE(ma.size() == mb.size());
  REQUIRE_FALSE(ma.empty());
  for (size_t i = 0; i < ma.size(); ++i) CHECK(mb[i] == Approx(ma[i]).epsilon(1e-5));
  // The process count is recorded, outside the hash.
  CHECK(query_integer(two, "SELECT MIN(processes) FROM runs") == 2);
  CHECK(query_integer(one, "SELECT MAX(processes) FROM runs") == 1);
  // The same runs: the process count is not part of a run's hash.
  engine::Database con(two, engine::OpenMode::ReadOnly);
  auto q = con.prepare("SELECT hash FROM runs ORDER BY hash");
  engine::Database con1(one, engine::OpenMode::ReadOnly);
  auto q1 = con1.prepare("SELECT hash FROM runs ORDER BY hash");
  while (q.step()) {
    REQUIRE(q1.step());
    CHECK(q.text(0) == q1.text(0));
  }
  CHECK_FALSE(q1.step());
}

TEST_CASE("data parallel: a global batch that does not divide is refused before any rank starts",
          "[data_parallel][cli]") {
  TempDir d("dp-divide");
  test::write_one_run_matrix(d, "dp", test::tiny_train_body());
  auto args = run_args(d, d.path() + "/x.db");
  args.insert(args.end(), {"--nproc", "3"});
  const auto out = test::run_chiar(args);
  CHECK(out.status == 2);
  // The [train] table's batch_size line of the tiny matrix.
  CHECK(out.output.rfind("chiar: " + d.path() + "/m.toml:", 0) == 0);
  CHECK(out.output.find(": key 'train.batch_size': 4 does not divide over 3 processes: the config names the global "
                        "batch, and each process trains an equal slice of it (run base/flat/seed=0)\n") !=
        std::string::npos);
  CHECK_FALSE(boost::filesystem::exists(d.path() + "/x.db"));
}

TEST_CASE("data parallel: a rank that dies stops the others, naming it, and the rerun resumes", "[data_parallel]") {
  TempDir d("dp-kill");
  write_long_matrix(d);
  const std::string db = d.path() + "/k.db", log = d.path() + "/first.log";
  const pid_t launcher = start_long_run(d, db, log);
  pid_t rank1 = -1;
  for (pid_t child : children_of(launcher))
    if (rank_of(child) == 1) rank1 = child;
  REQUIRE(rank1 > 0);
  REQUIRE(kill(rank1, SIGKILL) == 0);
  const int status = test::wait_chiar(launcher);
  const std::string first = read_text(log);
  INFO(first);
  CHECK(status == 3);
  CHECK(first.find("chiar: rank 1 died (signal 9)\n") != std::string::npos);
  check_rerun_resumes(d, db);
}

TEST_CASE("data parallel: SIGTERM stops every rank at one step, after rank 0's checkpoint", "[data_parallel]") {
  TempDir d("dp-term");
  write_long_matrix(d);
  const std::string db = d.path() + "/k.db", log = d.path() + "/first.log";
  const pid_t launcher = start_long_run(d, db, log);
  REQUIRE(kill(launcher, SIGTERM) == 0);
  const int status = test::wait_chiar(launcher);
  const std::string first = read_text(log);
  INFO(first);
  CHECK(status == 130);
  CHECK(first.find("base/flat/seed=1: interrupted; checkpoint saved, rerun to resume\n") != std::string::npos);
  CHECK(first.find("chiar: interrupted (SIGTERM forwarded to 2 ranks)") != std::string::npos);
  // Had the ranks stopped at different steps, a collective would have
  // failed (exit 3) instead.
  check_rerun_resumes(d, db);
}

TEST_CASE("data parallel: memory running out stops the group, exit 3; the run resumes from its checkpoint",
          "[data_parallel][faults]") {
  TempDir d("dp-oom");
  test::write_one_run_matrix(d, "dp_oom", test::tiny_train_body(12, 6, 4) + "log_every = 1\n");
  const std::string db = d.path() + "/oom.db";
  auto args = run_args(d, db);
  args.insert(args.end(), {"--nproc", "2"});
  {
    // Every rank has the variable: equal shards on equal devices run out
    // together, at step 6 here, after step 4's checkpoint.
    test::EnvScope failpoint("CHIAR_FAILPOINT", "train.step:6:oom");
    const auto oom = test::run_chiar(args);
    INFO(oom.output);
    CHECK(oom.status == 3);
    const std::string cause =
        "out of memory on cpu: out of memory at failpoint train.step (CHIAR_FAILPOINT asked for it)";
    CHECK(oom.output.find("[1/1] base/flat/seed=0: " + cause + "\n") != std::string::npos);
    CHECK(oom.output.find("chiar: [1/1] base/flat/seed=0: " + cause +
                          "; the process group stops (rerun to resume)\n") != std::string::npos);
    CHECK(oom.output.find("Exception raised from") == std::string::npos);
    CHECK(query_integer(db, "SELECT COUNT(*) FROM runs WHERE status = 'interrupted' AND error = '" + cause + "'") == 1);
  }
  const auto rerun = test::run_chiar(args);
  INFO(rerun.output);
  REQUIRE(rerun.status == 0);
  CHECK(rerun.output.find("base/flat/seed=0: resuming (") != std::string::npos);
  CHECK(query_integer(db, "SELECT COUNT(*) FROM runs WHERE status = 'done'") == 1);
  CHECK(query_integer(db, "SELECT MIN(step) FROM train_log") == 1);
  CHECK(query_integer(db, "SELECT COUNT(*) FROM train_log") == 12);
}
