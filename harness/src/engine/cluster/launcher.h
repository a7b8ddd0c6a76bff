#pragma once
// The local `--nproc` launcher: a run's ranks as child processes of this one.
#include <chrono>
#include <string>
#include <vector>

namespace chiar::engine {

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
