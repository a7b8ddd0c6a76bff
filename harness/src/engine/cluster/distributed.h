#pragma once
// One training run over several processes: who this process is in the world
// (from a launcher's environment), a c10d process group over Gloo to average
// gradients and share rank 0's decisions, and the local `--nproc` launcher.
// Every collective is c10d's; nothing here reduces or moves data itself.
//
// Errors follow the harness's policy: a malformed launcher variable is a
// chiar::UserError naming the variable; a peer that dies, hangs or never
// joins is a chiar::EnvironmentError whose message starts with
// "rank R of N: " and names what failed. No libtorch backtrace ever leaks.
#include <ATen/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace chiar::engine {

// ---------------------------------------------------------------- the world

// This process's place in a run. world_size == 1 (the default) is a run of
// one process: no process group, no rendezvous.
struct WorldInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;             // rank among the processes on this machine
  std::string master_addr;        // host of rank 0, which serves the rendezvous store
  int master_port = 0;            // its TCP port
  std::string launcher = "none";  // "none", "env" (RANK/WORLD_SIZE...) or "slurm"

  bool distributed() const { return world_size > 1; }
};

// Reads the world from a launcher's variables, first match wins:
//  1. "env" (torchrun, `chiar run --nproc`, any launcher): RANK and
//     WORLD_SIZE, both required once either is set; MASTER_ADDR and
//     MASTER_PORT, required when WORLD_SIZE > 1; LOCAL_RANK, else
//     SLURM_LOCALID, else RANK (one machine).
//  2. "slurm" (srun): SLURM_PROCID; SLURM_NTASKS, else SLURM_NPROCS, else
//     one task (a batch script without --ntasks; SLURM_PROCID must be 0
//     then); SLURM_LOCALID (else 0). MASTER_ADDR if set, else
//     the first host of SLURM_STEP_NODELIST, SLURM_NODELIST or
//     SLURM_JOB_NODELIST (the first of those set), where srun's block
//     distribution places task 0. MASTER_PORT if set, else
//     20000 + SLURM_JOB_ID % 10000: the same on every task without any
//     exchange, and below Linux's ephemeral ports (32768 and up), so no
//     outgoing connection holds it. Two multi-task steps of one job running
//     at once need MASTER_PORT set apart.
//     Note: inside an sbatch script without srun, SLURM_NTASKS is the job's
//     task count while only one process runs; launch ranks with srun.
//  3. Otherwise a world of one ("none").
// Malformed values throw UserError naming the variable, e.g.
// "RANK=abc: expected an integer", "RANK 3 >= WORLD_SIZE 2".
// Pure: reads only `env`.
WorldInfo world_from_environment(const std::map<std::string, std::string>& env);
// The same over this process's environment.
WorldInfo world_from_environment();

// The first host of a Slurm host list, expanded: "node[01-04,07]" -> "node01",
// "a,b" -> "a", "gpu-[3,5]" -> "gpu-3", "r[1-2]-n[5-6]" -> "r1-n5".
// `variable` names the list's variable in the UserError for a malformed one.
std::string first_slurm_host(const std::string& host_list, const std::string& variable);

// ------------------------------------------------------------ process group

struct ProcessGroupOptions {
  // The limit on each collective: a peer silent for this long is lost.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // The limit on joining: every rank reaching rank 0's store and announcing
  // itself there. Ranks get to the group at different times (one still
  // loading data, another node still starting), hence a longer default.
  std::chrono::milliseconds join_timeout{std::chrono::minutes(5)};
  // allreduce_mean and broadcast pack consecutive tensors of one dtype into
  // flat buckets of at most this many bytes (a larger tensor goes alone), and
  // run the buckets' collectives concurrently.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // Every rank bumps a counter in the store at this period. After a
  // collective fails, the survivors watch the counters for three periods to
  // name the ranks that stopped. Zero turns the heartbeat off: failures then
  // name no peer unless the store itself is gone (rank 0).
  std::chrono::milliseconds heartbeat_interval{std::chrono::seconds(1)};
  // The address or host name Gloo binds to on this machine; peers connect to
  // it. Empty: 127.0.0.1 when master_addr is a loopback address, else the
  // interface named by GLOO_SOCKET_IFNAME, else the address this host's name
  // resolves to (Gloo's default device).
  std::string gloo_address;
  // Gloo's worker threads: how many buckets reduce at once.
  int gloo_threads = 2;
};

// A collective started but not yet finished; see ProcessGroup's *_async.
// Move-only; its ProcessGroup must outlive it. wait() finishes it (and
// throws what it failed with). A handle dropped without wait() lets the
// collective run to its end in the background and leaves its tensors
// unspecified: some may hold the sum, others their old values.
class PendingCollective {
 public:
  PendingCollective();
  PendingCollective(PendingCollective&&) noexcept;
  PendingCollective& operator=(PendingCollective&&) noexcept;
  ~PendingCollective();
  // Blocks until every bucket is done and written back into the tensors the
  // collective was started with. Throws EnvironmentError as the synchronous
  // calls do. Waiting twice is a no-op.
  void wait();

  struct State;

 private:
  friend class ProcessGroup;
  explicit PendingCollective(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// The process group of a run: a c10d::TCPStore served by rank 0 at
// world.master_addr:master_port, and a c10d::ProcessGroupGloo over it. The
// constructor returns once all world_size ranks have joined, or throws
// EnvironmentError naming the ranks that did not join within join_timeout.
// With world_size 1 there is neither store nor Gloo, and every collective
// returns at once with the tensors unchanged.
//
// Contracts:
//  - Collectives match by order: every rank calls the same collectives, with
//    the same tensor shapes and dtypes, in the same order. The calls are not
//    thread-safe: one thread at a time, e.g. the training loop's (autograd's
//    CPU hooks run on the thread that called backward, which qualifies).
//  - Tensors are dense CPU tensors; they may be non-contiguous.
//  - After an EnvironmentError the group is broken: every later call throws
//    at once. Destroy it and end the process (exit status 3).
//  - Before a clean shutdown, call barrier(): rank 0 serves the store, and
//    its group going away while others still start collectives fails them.
//  - Collectives run on Gloo's worker threads; the synchronous calls block
//    the caller until their result is written back. Those threads, and the
//    heartbeat's, block SIGPIPE (Gloo's writes to a dead peer raise it); the
//    caller's own signal mask and the process's dispositions are untouched.
//
// Failure detection, with the defaults: a peer process that exits closes its
// sockets, so the ranks in a collective with it fail at once, then watch the
// heartbeats for 3 intervals (3 s) and throw naming it: "rank 0 of 4: lost
// contact with the process group during allreduce (peer rank 2 stopped
// responding): Connection closed by peer ...". Ranks waiting on those fail
// in turn when they exit, and still name the first (a rank that gave up
// itself is told apart). When rank 0 dies the store goes with it, and the
// others name rank 0 at once. A peer that hangs (alive, beating, but not
// entering the collective) surfaces after `timeout`, naming no peer.
class ProcessGroup {
 public:
  explicit ProcessGroup(const WorldInfo& world, const ProcessGroupOptions& options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;

  // Averages floating-point tensors across ranks in place: each becomes the
  // mean of its values on all ranks (the sum over ranks, divided by size()).
  // float, double and half reduce as they are; bfloat16, which Gloo cannot
  // carry, travels and sums as float and is rounded once on the way back.
  // Bucketed as ProcessGroupOptions::bucket_bytes says. Undefined tensors
  // (a parameter without a gradient) are skipped; every rank must have the
  // same ones undefined, or the buckets no longer match (the reduction then
  // fails or mixes values). Another dtype throws std::invalid_argument.
  void allreduce_mean(std::vector<at::Tensor>& tensors);
  // The same, started and not awaited: the buckets' reductions run on Gloo's
  // threads while the caller goes on (e.g. with the rest of backward). The
  // tensors must be neither read nor written until wait() returns; the
  // collective's place in the order is this call, not wait().
  PendingCollective allreduce_mean_async(std::vector<at::Tensor> tensors);

  // Sums one tensor across ranks in place (counts, routing statistics):
  // uint8, int8, int16, int32, int64, half, float, double or bfloat16 (as
  // float); bool and complex throw std::invalid_argument.
  void allreduce_sum(at::Tensor& tensor);

  // Overwrites the tensors on every rank with root's: the dtypes of
  // allreduce_sum and bool, exactly. Bucketed like allreduce_mean; undefined
  // tensors are skipped under the same rule.
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0);

  // Returns root's `text` on every rank (others' `text` is ignored): rank 0's
  // decisions, such as the checkpoint every rank resumes from.
  std::string broadcast_string(const std::string& text, int root = 0);

  // Returns once every rank has called it.
  void barrier();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// ----------------------------------------------------------------- launcher

// A free TCP port on `address` right now (bound to port 0, read back and
// released). Another process may take it before it is used: a rendezvous
// that fails to bind then reports the port. Throws EnvironmentError.
int pick_free_port(const std::string& address = "127.0.0.1");

struct LaunchOptions {
  // After the first failing rank, the others get SIGTERM, and SIGKILL if they
  // still run this long after.
  std::chrono::milliseconds grace{std::chrono::seconds(10)};
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick_free_port(master_addr)
};

struct LaunchResult {
  // 0 when every rank exited 0; else the first failing rank's exit status,
  // or 128 + the signal that killed it.
  int exit_status = 0;
  int failed_rank = -1;  // the rank that failed first; -1 when none
  // One line, empty on success: "rank 1 died (signal 9)",
  // "rank 2 exited with status 3"; after a forwarded SIGINT or SIGTERM it
  // starts "interrupted (SIGINT forwarded to 3 ranks)".
  std::string message;
};

// Runs `argv` (argv[0] a path, or a name looked up in PATH) as nproc ranks on
// this machine and waits for them: each child gets this process's
// environment plus RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT. The first rank to exit non-zero or die by a
// signal gets the others stopped (SIGTERM, then SIGKILL after the grace).
// SIGINT and SIGTERM sent to this process are forwarded to the ranks, which
// are then waited for (no SIGKILL). Children get SIGTERM should this process
// die first. Installs its own SIGINT, SIGTERM and SIGCHLD handlers while it
// runs (one launch at a time per process) and restores the previous ones.
// Throws UserError for nproc < 1 or an empty argv, EnvironmentError when a
// rank cannot be started (its program not found or not executable).
LaunchResult launch_local_ranks(int nproc, const std::vector<std::string>& argv, const LaunchOptions& options = {});

}  // namespace chiar::engine
