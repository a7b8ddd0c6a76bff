// test_distributed: one run over several processes (engine/cluster/world.h, process_group.h, launcher.h).
// The world read from launchers' variables; a real two-rank Gloo group made of
// two forked children of this test on 127.0.0.1 (one process per rank, as in
// a run: Gloo's ranks are never threads of one process here); ranks that die,
// hang or never join; and the local `--nproc` launcher over /bin/sh commands.
// Nothing here compares wall-clock times: each child waits for files or for
// the group, and a generous guard only turns a hang into a failure.
#include <catch2/catch.hpp>
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "engine/cluster/launcher.h"
#include "engine/cluster/process_group.h"
#include "engine/cluster/sigpipe.h"
#include "support/temp_dir.h"

using namespace chiar;
using namespace chiar::engine;
using test::TempDir;
namespace fs = boost::filesystem;

namespace {

using Env = std::map<std::string, std::string>;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits for a file another process writes; false after a guard that only a
// hang reaches.
bool await_file(const std::string& path) {
  for (int i = 0; i < 12000; ++i) {
    if (fs::exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

struct RankOutcome {
  int status = -1;     // exit status, or 128 + signal
  std::string report;  // what the rank's body returned ("" if it never did)
  std::string log;     // what the rank wrote to its standard error
};

// Runs body(rank) in `n` forked children of this process, one per rank, and
// returns each child's exit status, report (written to a file, as the
// child ends with _exit and leaves Catch alone) and standard error. A child
// that outlives the guard is killed and reported with status -1.
std::vector<RankOutcome> run_ranks(int n, const TempDir& dir, const std::function<std::string(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      // One thread: a child of a process whose OpenMP pool exists must not
      // start parallel regions. The tensors here are small anyway.
      at::set_num_threads(1);
      const std::string log = dir.path() + "/stderr-" + std::to_string(r) + ".txt";
      const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (log_fd >= 0) ::dup2(log_fd, STDERR_FILENO);
      std::string report;
      try {
        report = body(r);
      } catch (const EnvironmentError& e) {
        report = std::string("EnvironmentError: ") + e.what();
      } catch (const std::exception& e) {
        report = std::string("exception: ") + e.what();
      }
      std::ofstream(dir.path() + "/report-" + std::to_string(r) + ".txt", std::ios::binary) << report;
      _exit(0);
    }
    pids.push_back(pid);
  }
  std::vector<RankOutcome> out(n);
  for (int r = 0; r < n; ++r) {
    int status = 0;
    bool reaped = false;
    for (int i = 0; i < 12000 && !reaped; ++i) {
      reaped = waitpid(pids[r], &status, WNOHANG) == pids[r];
      if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (!reaped) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status, 0);
      continue;
    }
    out[r].status = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
    const std::string file = dir.path() + "/report-" + std::to_string(r) + ".txt";
    if (fs::exists(file)) out[r].report = read_text(file);
    out[r].log = read_text(dir.path() + "/stderr-" + std::to_string(r) + ".txt");
  }
  return out;
}

WorldInfo local_world(int rank, int size, int port) {
  WorldInfo w;
  w.rank = rank;
  w.world_size = size;
  w.local_rank = rank;
  w.master_addr = "127.0.0.1";
  w.master_port = port;
  w.launcher = "env";
  return w;
}

// Short collective timeouts; joining gets a generous one unless a test is
// about joining, as forked ranks may start late on a loaded machine.
ProcessGroupOptions short_options(int timeout_ms = 3000, int join_timeout_ms = 120000) {
  ProcessGroupOptions o;
  o.timeout = std::chrono::milliseconds(timeout_ms);
  o.join_timeout = std::chrono::milliseconds(join_timeout_ms);
  o.heartbeat_interval = std::chrono::milliseconds(200);
  return o;
}

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }

// What rank r holds before averaging: multiples of 1/4 (exact in float and
// double, as are their sums and halves).
at::Tensor values(int rank, int64_t n, at::ScalarType type, int salt) {
  return (at::arange(n, at::kDouble) * 0.25 + 0.5 * (rank + 1) * (salt + 1)).to(type);
}

}  // namespace

// ------------------------------------------------------------------ world

// Gloo's write to a dead peer raises SIGPIPE in the writing thread; under
// SigpipeBlock it stays pending while the write fails with EPIPE. When the
// block ends in that thread, the pending signal must be taken, not delivered
// (delivered, its default ends the process with no message).
TEST_CASE("SigpipeBlock: a write to a closed socket fails with EPIPE, and the process outlives the block",
          "[distributed]") {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  REQUIRE(close(fds[1]) == 0);
  {
    const SigpipeBlock block;
    errno = 0;
    CHECK(write(fds[0], "x", 1) == -1);
    CHECK(errno == EPIPE);
    sigset_t pending;
    sigpending(&pending);
    CHECK(sigismember(&pending, SIGPIPE) == 1);
  }
  close(fds[0]);
  sigset_t pending, mask;
  sigpending(&pending);
  CHECK(sigismember(&pending, SIGPIPE) == 0);
  pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  CHECK(sigismember(&mask, SIGPIPE) == 0);  // the thread's mask as it was
}

TEST_CASE("world_from_environment: nothing set is a world of one", "[distributed]") {
  const WorldInfo w = world_from_environment(Env{{"HOME", "/root"}, {"SLURM_JOB_ID", "77"}});
  CHECK(w.rank == 0);
  CHECK(w.world_size == 1);
  CHECK(w.local_rank == 0);
  CHECK(w.launcher == "none");
  CHECK_FALSE(w.distributed());
  // A world of one needs no rendezvous address.
  const WorldInfo one = world_from_environment(Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  CHECK(one.world_size == 1);
  CHECK(one.launcher == "env");
}

TEST_CASE("world_from_environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT", "[distributed]") {
  Env env{{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "29500"}};
  WorldInfo w = world_from_environment(env);
  CHECK(w.rank == 2);
  CHECK(w.world_size == 4);
  CHECK(w.local_rank == 2);  // no LOCAL_RANK: one machine
  CHECK(w.master_addr == "10.0.0.5");
  CHECK(w.master_port == 29500);
  CHECK(w.launcher == "env");
  CHECK(w.distributed());

  env["LOCAL_RANK"] = "0";
  CHECK(world_from_environment(env).local_rank == 0);
  env.erase("LOCAL_RANK");
  env["SLURM_LOCALID"] = "1";
  CHECK(world_from_environment(env).local_rank == 1);

  // These variables win over Slurm's (torchrun inside an allocation).
  env["SLURM_PROCID"] = "0";
  env["SLURM_NTASKS"] = "8";
  w = world_from_environment(env);
  CHECK(w.launcher == "env");
  CHECK(w.world_size == 4);
}

TEST_CASE("world_from_environment: Slurm's variables", "[distributed]") {
  Env env{{"SLURM_PROCID", "3"},
          {"SLURM_NTASKS", "4"},
          {"SLURM_LOCALID", "1"},
          {"SLURM_NODELIST", "node[01-04,07]"},
          {"SLURM_JOB_ID", "123456"}};
  WorldInfo w = world_from_environment(env);
  CHECK(w.launcher == "slurm");
  CHECK(w.rank == 3);
  CHECK(w.world_size == 4);
  CHECK(w.local_rank == 1);
  CHECK(w.master_addr == "node01");
  CHECK(w.master_port == 20000 + 123456 % 10000);

  // The step's node list first, then the job's; MASTER_* override both.
  env["SLURM_STEP_NODELIST"] = "gpu-[3,5]";
  CHECK(world_from_environment(env).master_addr == "gpu-3");
  env.erase("SLURM_STEP_NODELIST");
  env.erase("SLURM_NODELIST");
  env["SLURM_JOB_NODELIST"] = "a,b";
  CHECK(world_from_environment(env).master_addr == "a");
  env["MASTER_ADDR"] = "head";
  env["MASTER_PORT"] = "4000";
  w = world_from_environment(env);
  CHECK(w.master_addr == "head");
  CHECK(w.master_port == 4000);

  // One task: no host list or port needed.
  const WorldInfo single = world_from_environment(Env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  CHECK(single.world_size == 1);
  CHECK(single.launcher == "slurm");
  // A batch script without --ntasks sets no task count: one task.
  CHECK(world_from_environment(Env{{"SLURM_PROCID", "0"}, {"SLURM_JOB_ID", "9"}}).world_size == 1);
  // The older name of the task count.
  CHECK(world_from_environment(
            Env{{"SLURM_PROCID", "1"}, {"SLURM_NPROCS", "2"}, {"SLURM_NODELIST", "n"}, {"SLURM_JOB_ID", "9"}})
            .world_size == 2);
}

TEST_CASE("first_slurm_host: Slurm's compressed host lists", "[distributed]") {
  CHECK(first_slurm_host("node[01-04,07]", "L") == "node01");
  CHECK(first_slurm_host("a,b", "L") == "a");
  CHECK(first_slurm_host("gpu-[3,5]", "L") == "gpu-3");
  CHECK(first_slurm_host("single", "L") == "single");
  CHECK(first_slurm_host("n[7-9]-ib,m[1-2]", "L") == "n7-ib");
  CHECK(first_slurm_host("rack[2-3]-n[010-020]", "L") == "rack2-n010");
  CHECK(first_slurm_host("x[5]", "L") == "x5");
  CHECK_THROWS_WITH(first_slurm_host("node[01-04", "SLURM_NODELIST"),
                    "SLURM_NODELIST=node[01-04: cannot read its first host ('[' without ']')");
  CHECK_THROWS_WITH(first_slurm_host("node[a-b]", "SLURM_NODELIST"),
                    "SLURM_NODELIST=node[a-b]: cannot read its first host (expected numbers inside [...], found "
                    "'a-b')");
  CHECK_THROWS_WITH(first_slurm_host(",b", "SLURM_NODELIST"),
                    "SLURM_NODELIST=,b: cannot read its first host (empty host name)");
  CHECK_THROWS_AS(first_slurm_host("a]", "L"), UserError);
}

TEST_CASE("world_from_environment: malformed values name the variable", "[distributed]") {
  const auto message = [](const Env& env) {
    try {
      world_from_environment(env);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no UserError");
  };
  const Env ok{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}};
  const auto with = [&](const std::string& key, const std::string& value) {
    Env env = ok;
    env[key] = value;
    return env;
  };
  CHECK(message(with("RANK", "abc")) == "RANK=abc: expected an integer");
  CHECK(message(with("RANK", "1x")) == "RANK=1x: expected an integer");
  CHECK(message(with("RANK", "-1")) == "RANK=-1: expected an integer >= 0");
  CHECK(message(with("RANK", "3")) == "RANK 3 >= WORLD_SIZE 2");
  CHECK(message(with("WORLD_SIZE", "0")) == "WORLD_SIZE=0: expected an integer >= 1");
  CHECK(message(with("WORLD_SIZE", "99999999999999999999")) ==
        "WORLD_SIZE=99999999999999999999: expected an integer >= 1");
  CHECK(message(with("LOCAL_RANK", "x")) == "LOCAL_RANK=x: expected an integer");
  CHECK(message(with("MASTER_PORT", "70000")) == "MASTER_PORT=70000: expected a port in 1..65535");
  CHECK(message(with("MASTER_PORT", "http")) == "MASTER_PORT=http: expected a port in 1..65535");
  CHECK(message(Env{{"RANK", "0"}}) == "RANK is set but WORLD_SIZE is not");
  CHECK(message(Env{{"WORLD_SIZE", "2"}}) == "WORLD_SIZE is set but RANK is not");
  CHECK(message(Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "1"}}) ==
        "MASTER_ADDR is not set (WORLD_SIZE=2 needs it)");
  CHECK(message(Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}) ==
        "MASTER_PORT is not set (WORLD_SIZE=2 needs it)");

  const Env slurm{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_NODELIST", "n1"}, {"SLURM_JOB_ID", "5"}};
  const auto slurm_with = [&](const std::string& key, const std::string& value) {
    Env env = slurm;
    if (value.empty())
      env.erase(key);
    else
      env[key] = value;
    return env;
  };
  CHECK(message(slurm_with("SLURM_PROCID", "one")) == "SLURM_PROCID=one: expected an integer");
  CHECK(message(slurm_with("SLURM_PROCID", "2")) == "SLURM_PROCID 2 >= SLURM_NTASKS 2");
  CHECK(message(slurm_with("SLURM_NTASKS", "")) ==
        "SLURM_PROCID is 1 but neither SLURM_NTASKS nor SLURM_NPROCS is set");
  CHECK(message(slurm_with("SLURM_NTASKS", "0")) == "SLURM_NTASKS=0: expected an integer >= 1");
  CHECK(message(slurm_with("SLURM_JOB_ID", "")) == "neither MASTER_PORT nor SLURM_JOB_ID is set: set MASTER_PORT");
  CHECK(message(slurm_with("SLURM_NODELIST", "")) ==
        "none of SLURM_STEP_NODELIST, SLURM_NODELIST, SLURM_JOB_NODELIST is set: set MASTER_ADDR to task 0's host");
  CHECK(message(slurm_with("SLURM_NODELIST", "n[1-")) ==
        "SLURM_NODELIST=n[1-: cannot read its first host ('[' without ']')");
}

// ---------------------------------------------------------- process group

TEST_CASE("ProcessGroup: a world of one needs no rendezvous", "[distributed]") {
  ProcessGroup pg(WorldInfo{});
  CHECK(pg.rank() == 0);
  CHECK(pg.size() == 1);
  std::vector<at::Tensor> t{at::arange(4, at::kFloat), at::Tensor()};
  const at::Tensor before = t[0].clone();
  pg.allreduce_mean(t);
  CHECK(at::equal(t[0], before));
  at::Tensor counts = at::arange(3, at::kLong);
  pg.allreduce_sum(counts);
  CHECK(at::equal(counts, at::arange(3, at::kLong)));
  pg.broadcast(t);
  CHECK(pg.broadcast_string("resume from step 40") == "resume from step 40");
  pg.barrier();
  // Misuse is refused even alone, as it would be in a world of many.
  std::vector<at::Tensor> ints{at::arange(3, at::kInt)};
  CHECK_THROWS_AS(pg.allreduce_mean(ints), std::invalid_argument);
  at::Tensor flags = at::ones({2}, at::kBool);
  CHECK_THROWS_WITH(pg.allreduce_sum(flags), "distributed allreduce_sum: Gloo cannot carry Bool tensors");
  CHECK_THROWS_AS(pg.broadcast(t, 1), std::invalid_argument);
}

TEST_CASE("ProcessGroup: two ranks average, sum and broadcast", "[distributed]") {
  TempDir dir("distributed");
  const int port = pick_free_port();
  const auto outcomes = run_ranks(2, dir, [&](int rank) -> std::string {
    ProcessGroupOptions options = short_options(20000);
    options.bucket_bytes = 64;  // forces several buckets below
    ProcessGroup pg(local_world(rank, 2, port), options);
    if (pg.rank() != rank || pg.size() != 2) return "wrong rank or size";
    std::string failures;
    const auto expect = [&](bool ok, const std::string& what) {
      if (!ok) failures += what + "; ";
    };

    // Mixed sizes and dtypes: float 3 + float 10 (52 bytes) | double 4 |
    // float 20 (80 bytes, alone) | float 1, an undefined gradient | bfloat16
    // 5 (carried as float) | half 6. The 2x5 tensor is a transposed view:
    // not contiguous.
    const auto make = [](int r) {
      return std::vector<at::Tensor>{values(r, 3, at::kFloat, 0),    values(r, 10, at::kFloat, 1).view({5, 2}).t(),
                                     values(r, 4, at::kDouble, 2),   values(r, 20, at::kFloat, 3),
                                     values(r, 1, at::kFloat, 4),    at::Tensor(),
                                     values(r, 5, at::kBFloat16, 5), values(r, 6, at::kHalf, 6)};
    };
    std::vector<at::Tensor> grads = make(rank);
    const std::vector<at::Tensor> mine = make(0), theirs = make(1);
    pg.allreduce_mean(grads);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      if (!mine[i].defined()) {
        expect(!grads[i].defined(), "undefined tensor " + std::to_string(i) + " became defined");
        continue;
      }
      const at::Tensor mean = ((mine[i].to(at::kDouble) + theirs[i].to(at::kDouble)) / 2).to(mine[i].scalar_type());
      expect(
          grads[i].sizes() == mean.sizes() && grads[i].scalar_type() == mean.scalar_type() && at::equal(grads[i], mean),
          "mean of tensor " + std::to_string(i));
    }

    // Started, then awaited: the same result.
    std::vector<at::Tensor> later{values(rank, 7, at::kFloat, 5), values(rank, 30, at::kDouble, 6)};
    PendingCollective pending = pg.allreduce_mean_async(later);
    pending.wait();
    pending.wait();  // a no-op
    expect(at::equal(later[0], (values(0, 7, at::kFloat, 5) + values(1, 7, at::kFloat, 5)) / 2), "async mean 0");
    expect(at::equal(later[1], (values(0, 30, at::kDouble, 6) + values(1, 30, at::kDouble, 6)) / 2), "async mean 1");

    at::Tensor counts = at::tensor({int64_t{rank + 1}, int64_t{10 * rank}, int64_t{-3}});
    pg.allreduce_sum(counts);
    expect(at::equal(counts, at::tensor({int64_t{3}, int64_t{10}, int64_t{-6}})), "sum of counts");
    at::Tensor shorts = at::full({2}, static_cast<int64_t>(100 * (rank + 1)), at::kShort);  // carried as int32
    pg.allreduce_sum(shorts);
    expect(shorts.scalar_type() == at::kShort && at::equal(shorts, at::full({2}, int64_t{300}, at::kShort)),
           "sum of int16");
    at::Tensor strided = at::full({3, 2}, static_cast<double>(rank + 1), at::kDouble).t();
    pg.allreduce_sum(strided);
    expect(at::equal(strided, at::full({2, 3}, 3.0, at::kDouble)), "sum of a strided tensor");

    // Rank 1's parameters reach rank 0; a non-contiguous target too.
    std::vector<at::Tensor> params{values(rank, 6, at::kFloat, 7), values(rank, 12, at::kFloat, 8).view({3, 4}).t(),
                                   at::full({2}, int64_t{rank}, at::kLong),
                                   at::full({3}, rank == 1, at::kBool)};  // carried as uint8
    pg.broadcast(params, 1);
    expect(at::equal(params[0], values(1, 6, at::kFloat, 7)), "broadcast 0");
    expect(at::equal(params[1], values(1, 12, at::kFloat, 8).view({3, 4}).t()), "broadcast 1");
    expect(at::equal(params[2], at::full({2}, int64_t{1}, at::kLong)), "broadcast 2");
    expect(params[3].scalar_type() == at::kBool && params[3].all().item<bool>(), "broadcast of bool");

    const std::string decision = pg.broadcast_string(rank == 0 ? "resume from step 40" : "ignored");
    expect(decision == "resume from step 40", "broadcast_string: " + decision);
    expect(pg.broadcast_string(rank == 1 ? "" : "ignored", 1).empty(), "empty broadcast_string");
    pg.barrier();
    return failures.empty() ? "ok" : failures;
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(outcomes[r].status == 0);
    CHECK(outcomes[r].report == "ok");
  }
}

TEST_CASE("ProcessGroup: a rank that dies stops the others, naming it", "[distributed]") {
  TempDir dir("distributed");
  // Which rank dies: 1, or 0 (which also serves the store).
  const int dead = GENERATE(1, 0);
  const int alive = 1 - dead;
  const int port = pick_free_port();
  const auto outcomes = run_ranks(2, dir, [&](int rank) -> std::string {
    ProcessGroup pg(local_world(rank, 2, port), short_options());
    // Both ranks in the group first: without this, rank 0 could leave while
    // rank 1 was still connecting, and rank 1 would fail to join instead.
    pg.barrier();
    if (rank == dead) _exit(0);  // gone before the collective, without a word
    at::Tensor t = at::ones({4});
    try {
      pg.allreduce_sum(t);
      return "the collective succeeded";
    } catch (const EnvironmentError& e) {
      std::string report = e.what();
      // The group is broken now: every later call fails at once.
      try {
        pg.barrier();
        report += "\nbarrier succeeded";
      } catch (const EnvironmentError& again) {
        report += std::string("\n") + again.what();
      }
      return report;
    }
  });
  CHECK(outcomes[dead].status == 0);
  CHECK(outcomes[dead].report.empty());
  const std::string& report = outcomes[alive].report;
  INFO(report);
  CHECK(outcomes[alive].status == 0);
  const std::string me = "rank " + std::to_string(alive) + " of 2: ";
  if (dead == 1) {
    CHECK(starts_with(report, me + "lost contact with the process group during allreduce (peer rank 1 stopped "
                                   "responding): "));
  } else {
    CHECK(starts_with(report, me +
                                  "lost contact with the process group during allreduce (rank 0, which serves "
                                  "the rendezvous store at 127.0.0.1:" +
                                  std::to_string(port) + ", is unreachable): "));
  }
  CHECK(report.find("\n" + me + "the process group failed earlier: lost contact") != std::string::npos);
  CHECK(report.find("Exception raised from") == std::string::npos);  // no libtorch backtrace
  CHECK(report.find(".cc:") == std::string::npos);                   // nor Gloo's source location
}

TEST_CASE("ProcessGroup: a hung rank times out and is not blamed", "[distributed]") {
  TempDir dir("distributed");
  const int port = pick_free_port();
  const std::string done = dir.path() + "/rank0-done";
  const auto outcomes = run_ranks(2, dir, [&](int rank) -> std::string {
    // A heartbeat slow enough that a busy machine never stalls one of rank
    // 1's beats for the three periods rank 0 watches.
    ProcessGroupOptions options = short_options(1000);
    options.heartbeat_interval = std::chrono::seconds(1);
    ProcessGroup pg(local_world(rank, 2, port), options);
    if (rank == 1) {
      // Alive (its heartbeat runs) but never joins the collective.
      if (!await_file(done)) return "rank 0 never finished";
      _exit(0);
    }
    at::Tensor t = at::ones({4});
    std::string report;
    try {
      pg.allreduce_sum(t);
      report = "the collective succeeded";
    } catch (const EnvironmentError& e) {
      report = e.what();
    }
    std::ofstream(done) << "done";
    return report;
  });
  const std::string& report = outcomes[0].report;
  INFO(report);
  CHECK(starts_with(report, "rank 0 of 2: lost contact with the process group during allreduce: "));
  CHECK(report.find("Timed out") != std::string::npos);
}

TEST_CASE("ProcessGroup: a rank that never joins is named", "[distributed]") {
  TempDir dir("distributed");
  const int port = pick_free_port();
  // Rank 0 of 2 alone: it serves the store and waits for rank 1.
  auto outcomes = run_ranks(1, dir, [&](int) -> std::string {
    ProcessGroup pg(local_world(0, 2, port), short_options(1000, 1000));
    return "joined";
  });
  CHECK(outcomes[0].report == "EnvironmentError: rank 0 of 2: rank 1 did not join the process group at 127.0.0.1:" +
                                  std::to_string(port) + " within 1 s");
  // Rank 1 of 2 alone: no store to reach.
  const int empty_port = pick_free_port();
  outcomes = run_ranks(1, dir, [&](int) -> std::string {
    ProcessGroup pg(local_world(1, 2, empty_port), short_options(1000, 1000));
    return "joined";
  });
  INFO(outcomes[0].report);
  CHECK(starts_with(outcomes[0].report,
                    "EnvironmentError: rank 1 of 2: cannot reach the rendezvous store at "
                    "127.0.0.1:" +
                        std::to_string(empty_port) + " within 1 s: "));
  CHECK(outcomes[0].report.find("Exception raised from") == std::string::npos);
  // The error is the one message: c10d's own lines about the failed
  // connection are silenced, whether libtorch logs through glog or not.
  CHECK(outcomes[0].log.find("c10d") == std::string::npos);
}

// --------------------------------------------------------------- launcher

TEST_CASE("launch_local_ranks: every rank gets its place in the world", "[distributed]") {
  TempDir dir("distributed");
  LaunchOptions options;
  options.master_port = 0;
  const LaunchResult result = launch_local_ranks(
      3,
      {"sh", "-c", "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT\" > \"$0/rank-$RANK\"", dir.path()},
      options);
  CHECK(result.exit_status == 0);
  CHECK(result.failed_rank == -1);
  CHECK(result.message.empty());
  std::string port;
  for (int r = 0; r < 3; ++r) {
    std::istringstream line(read_text(dir.path() + "/rank-" + std::to_string(r)));
    std::string rank, size, local, addr, this_port;
    line >> rank >> size >> local >> addr >> this_port;
    CHECK(rank == std::to_string(r));
    CHECK(size == "3");
    CHECK(local == std::to_string(r));
    CHECK(addr == "127.0.0.1");
    if (r == 0) port = this_port;
    CHECK(this_port == port);  // one rendezvous for all
  }
  CHECK(std::stoi(port) > 0);
}

TEST_CASE("launch_local_ranks: the first failing rank stops the others", "[distributed]") {
  TempDir dir("distributed");
  LaunchOptions options;
  options.grace = std::chrono::milliseconds(200);
  // Ranks 0 and 2 would sleep for ten minutes; rank 1 fails once both are
  // asleep. The launch returning at all shows they were stopped.
  const std::string script =
      "d=\"$0\"; if [ \"$RANK\" = 1 ]; then"
      "  while [ ! -e \"$d/ready-0\" ] || [ ! -e \"$d/ready-2\" ]; do sleep 0.01; done; FAIL; "
      "else touch \"$d/ready-$RANK\"; exec sleep 600; fi";
  SECTION("by exit status") {
    std::string s = script;
    s.replace(s.find("FAIL"), 4, "exit 3");
    const LaunchResult r = launch_local_ranks(3, {"/bin/sh", "-c", s, dir.path()}, options);
    CHECK(r.failed_rank == 1);
    CHECK(r.exit_status == 3);
    CHECK(r.message == "rank 1 exited with status 3");
  }
  SECTION("by a signal") {
    std::string s = script;
    s.replace(s.find("FAIL"), 4, "kill -9 $$");
    const LaunchResult r = launch_local_ranks(3, {"/bin/sh", "-c", s, dir.path()}, options);
    CHECK(r.failed_rank == 1);
    CHECK(r.exit_status == 128 + 9);
    CHECK(r.message == "rank 1 died (signal 9)");
  }
  SECTION("ranks that ignore SIGTERM are killed after the grace") {
    std::string s = script;
    s.replace(s.find("FAIL"), 4, "exit 4");
    s.replace(s.find("else "), 5, "else trap '' TERM; ");
    const LaunchResult r = launch_local_ranks(3, {"/bin/sh", "-c", s, dir.path()}, options);
    CHECK(r.failed_rank == 1);
    CHECK(r.exit_status == 4);
    CHECK(r.message == "rank 1 exited with status 4");
  }
}

TEST_CASE("launch_local_ranks: SIGINT to the launcher reaches the ranks", "[distributed]") {
  TempDir dir("distributed");
  // Rank 0 interrupts the launcher (its parent: this test process) once
  // rank 1 is asleep; the launcher forwards SIGINT, which ends both sleeps.
  const std::string s =
      "d=\"$0\"; if [ \"$RANK\" = 0 ]; then"
      "  while [ ! -e \"$d/ready-1\" ]; do sleep 0.01; done; kill -INT $PPID; exec sleep 600; "
      "else touch \"$d/ready-1\"; exec sleep 600; fi";
  const LaunchResult r = launch_local_ranks(2, {"/bin/sh", "-c", s, dir.path()});
  CHECK(r.exit_status == 128 + SIGINT);
  CHECK(starts_with(r.message, "interrupted (SIGINT forwarded to 2 ranks); rank "));
  CHECK(r.message.find(" died (signal 2)") != std::string::npos);
}

TEST_CASE("launch_local_ranks: refusals", "[distributed]") {
  CHECK_THROWS_WITH(launch_local_ranks(0, {"true"}), "--nproc 0: expected a number of processes >= 1");
  CHECK_THROWS_WITH(launch_local_ranks(2, {}), "--nproc: no command to run");
  CHECK_THROWS_WITH(launch_local_ranks(2, {"chiar-no-such-program-here"}),
                    "cannot start the ranks: 'chiar-no-such-program-here' is not in PATH");
  CHECK_THROWS_WITH(launch_local_ranks(2, {"/nonexistent/chiar"}),
                    "cannot start rank 0: /nonexistent/chiar: No such file or directory");
  CHECK_THROWS_AS(launch_local_ranks(2, {"/nonexistent/chiar"}), EnvironmentError);
}
