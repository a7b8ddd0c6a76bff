#pragma once
// One training run over several processes: a c10d process group over Gloo
// to average gradients and share rank 0's decisions (the world it spans:
// world.h; the local launcher: launcher.h). Every collective is c10d's;
// nothing here reduces or moves data itself.
//
// Errors follow the harness's policy: a peer that dies, hangs or never
// joins is a chiar::EnvironmentError whose message starts with
// "rank R of N: " and names what failed. No libtorch backtrace ever leaks.
#include <ATen/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/cluster/world.h"

namespace chiar::engine {

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

}  // namespace chiar::engine
