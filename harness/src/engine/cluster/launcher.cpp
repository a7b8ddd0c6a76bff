#include "launcher.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "chiar/error.h"

extern char** environ;

namespace chiar::engine {

int pick_free_port(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(address.c_str(), "0", &hints, &found); rc != 0)
    throw EnvironmentError("cannot pick a free port on '" + address + "': " + gai_strerror(rc));
  std::string error = "no address";
  int port = 0;
  for (addrinfo* a = found; a && port == 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(found);
  if (port == 0) throw EnvironmentError("cannot pick a free port on '" + address + "': " + error);
  return port;
}

namespace {

// The launcher's signal state: handlers only note the signal and wake the
// wait loop through a pipe.
int g_wake[2] = {-1, -1};
std::atomic<int> g_forward{0};
std::atomic<bool> g_launching{false};
static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only touch lock-free atomics");

extern "C" void launcher_signal(int sig) {
  const int saved = errno;
  if (sig != SIGCHLD) g_forward.store(sig);
  const char byte = 0;
  [[maybe_unused]] const ssize_t ignored = write(g_wake[1], &byte, 1);
  errno = saved;
}

constexpr int kHandled[] = {SIGINT, SIGTERM, SIGCHLD};

// Installs the handlers and blocks the signals until release(); restores
// everything on destruction.
class SignalScope {
 public:
  SignalScope() {
    bool expected = false;
    if (!g_launching.compare_exchange_strong(expected, true))
      throw std::logic_error("launch_local_ranks: another launch is running in this process");
    if (pipe2(g_wake, O_CLOEXEC | O_NONBLOCK) != 0) {
      g_launching = false;
      throw EnvironmentError(std::string("cannot start the ranks: pipe: ") + std::strerror(errno));
    }
    g_forward = 0;
    sigset_t block;
    sigemptyset(&block);
    for (int s : kHandled) sigaddset(&block, s);
    pthread_sigmask(SIG_BLOCK, &block, &old_mask_);
    struct sigaction action {};
    action.sa_handler = launcher_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    for (std::size_t i = 0; i < std::size(kHandled); ++i) sigaction(kHandled[i], &action, &old_actions_[i]);
  }
  ~SignalScope() {
    for (std::size_t i = 0; i < std::size(kHandled); ++i) sigaction(kHandled[i], &old_actions_[i], nullptr);
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    close(g_wake[0]);
    close(g_wake[1]);
    g_wake[0] = g_wake[1] = -1;
    g_launching = false;
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  // Lets the blocked signals in (and any pending one through).
  void release() { pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr); }
  const sigset_t& old_mask() const { return old_mask_; }

 private:
  sigset_t old_mask_{};
  struct sigaction old_actions_[std::size(kHandled)]{};
};

std::string resolve_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    struct stat info {};
    if (stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  throw EnvironmentError("cannot start the ranks: '" + name + "' is not in PATH");
}

std::string status_text(int rank, int status) {
  if (WIFSIGNALED(status))
    return "rank " + std::to_string(rank) + " died (signal " + std::to_string(WTERMSIG(status)) + ")";
  return "rank " + std::to_string(rank) + " exited with status " + std::to_string(WEXITSTATUS(status));
}

int exit_code(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

// Signals every child still running, waits up to `grace` for them, then
// kills the rest; reaps all. Used when a rank cannot even be started.
void stop_children(std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  for (pid_t p : pids) kill(p, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (!pids.empty()) {
    pids.erase(std::remove_if(pids.begin(), pids.end(),
                              [](pid_t p) {
                                int status = 0;
                                return waitpid(p, &status, WNOHANG) == p;
                              }),
               pids.end());
    if (pids.empty()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) {
        int status = 0;
        while (waitpid(p, &status, 0) < 0 && errno == EINTR) {
        }
      }
      pids.clear();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// Each rank's environment: this process's, less the launcher's variables,
// plus RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT.
std::vector<std::vector<std::string>> rank_environments(int nproc, const LaunchOptions& options, int port) {
  const std::set<std::string> ours = {"RANK",        "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                      "MASTER_ADDR", "MASTER_PORT"};
  std::vector<std::string> inherited;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    if (!ours.count(entry.substr(0, entry.find('=')))) inherited.push_back(entry);
  }
  std::vector<std::vector<std::string>> envs(nproc, inherited);
  for (int r = 0; r < nproc; ++r) {
    envs[r].push_back("RANK=" + std::to_string(r));
    envs[r].push_back("LOCAL_RANK=" + std::to_string(r));
    envs[r].push_back("WORLD_SIZE=" + std::to_string(nproc));
    envs[r].push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    envs[r].push_back("MASTER_ADDR=" + options.master_addr);
    envs[r].push_back("MASTER_PORT=" + std::to_string(port));
  }
  return envs;
}

// The null-terminated pointers into `strings` that execve takes.
std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Forks rank r and executes `program` in it; returns its pid once the exec
// succeeded. When it cannot start, stops the ranks already `started` and
// throws EnvironmentError. Everything the child needs is built before: between
// fork and exec only async-signal-safe calls are allowed.
pid_t start_rank(int r, const std::string& program, char* const* argv, char* const* envp, const sigset_t& child_mask,
                 std::vector<pid_t>& started, std::chrono::milliseconds grace) {
  const pid_t launcher = getpid();
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    const std::string cause = std::strerror(errno);
    stop_children(started, grace);
    throw EnvironmentError("cannot start rank " + std::to_string(r) + ": pipe: " + cause);
  }
  const pid_t pid = fork();
  if (pid == 0) {
    // The child: default signal handling and mask, a SIGTERM should the
    // launcher die, then the program. On failure errno goes up the pipe.
    close(report[0]);
    struct sigaction fallback {};
    fallback.sa_handler = SIG_DFL;
    sigemptyset(&fallback.sa_mask);
    for (int s : kHandled) sigaction(s, &fallback, nullptr);
    sigprocmask(SIG_SETMASK, &child_mask, nullptr);  // one thread now; the async-signal-safe call
    // The death signal follows the forking thread, which blocks in
    // launch_local_ranks until every rank has ended.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher) _exit(1);
    execve(program.c_str(), argv, envp);
    const int error = errno;
    [[maybe_unused]] const ssize_t ignored = write(report[1], &error, sizeof error);
    _exit(127);
  }
  const int fork_error = errno;
  close(report[1]);
  if (pid < 0) {
    close(report[0]);
    stop_children(started, grace);
    throw EnvironmentError("cannot start rank " + std::to_string(r) + ": fork: " + std::strerror(fork_error));
  }
  int exec_error = 0;
  ssize_t got;
  while ((got = read(report[0], &exec_error, sizeof exec_error)) < 0 && errno == EINTR) {
  }
  close(report[0]);
  if (got > 0) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    stop_children(started, grace);
    throw EnvironmentError("cannot start rank " + std::to_string(r) + ": " + program + ": " +
                           std::strerror(exec_error));
  }
  return pid;
}

// Waits for every rank. The first to fail gets the others a SIGTERM, and a
// SIGKILL `grace` later; SIGINT and SIGTERM this process receives are
// forwarded to the ranks still running.
LaunchResult wait_for_ranks(const std::vector<pid_t>& pids, std::chrono::milliseconds grace) {
  const int nproc = static_cast<int>(pids.size());
  LaunchResult result;
  std::vector<bool> running(nproc, true);
  int still_running = nproc;
  int forwarded = 0;
  bool terminating = false, killed = false;
  std::chrono::steady_clock::time_point deadline;
  const auto signal_running = [&](int sig) {
    for (int r = 0; r < nproc; ++r)
      if (running[r]) kill(pids[r], sig);
  };
  while (true) {
    for (int r = 0; r < nproc; ++r) {
      int status = 0;
      if (!running[r] || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      running[r] = false;
      --still_running;
      if (result.failed_rank < 0 && exit_code(status) != 0) {
        result.failed_rank = r;
        result.exit_status = exit_code(status);
        result.message = status_text(r, status);
      }
    }
    if (still_running == 0) break;
    if (const int sig = g_forward.exchange(0)) {
      forwarded = sig;
      signal_running(sig);
    }
    if (result.failed_rank >= 0 && !terminating) {
      terminating = true;
      signal_running(SIGTERM);
      deadline = std::chrono::steady_clock::now() + grace;
    }
    int wait_ms = 1000;  // a backstop; SIGCHLD and forwarded signals wake the loop
    if (terminating && !killed) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        signal_running(SIGKILL);
        killed = true;
      } else {
        wait_ms = static_cast<int>(std::min<long long>(wait_ms, left.count()));
      }
    }
    pollfd wake{g_wake[0], POLLIN, 0};
    poll(&wake, 1, wait_ms);
    char drain[64];
    while (read(g_wake[0], drain, sizeof drain) > 0) {
    }
  }
  if (forwarded) {
    const std::string note = std::string("interrupted (") + signal_name(forwarded) + " forwarded to " +
                             std::to_string(nproc) + (nproc == 1 ? " rank)" : " ranks)");
    result.message = result.message.empty() ? note : note + "; " + result.message;
  }
  return result;
}

}  // namespace

LaunchResult launch_local_ranks(int nproc, const std::vector<std::string>& argv, const LaunchOptions& options) {
  if (nproc < 1) throw UserError("--nproc " + std::to_string(nproc) + ": expected a number of processes >= 1");
  if (argv.empty() || argv[0].empty()) throw UserError("--nproc: no command to run");
  const std::string program = resolve_program(argv[0]);
  const int port = options.master_port > 0 ? options.master_port : pick_free_port(options.master_addr);
  std::vector<std::vector<std::string>> envs = rank_environments(nproc, options, port);
  std::vector<std::string> args = argv;
  std::vector<char*> arg_pointers = c_strings(args);
  std::vector<std::vector<char*>> env_pointers;
  for (auto& env : envs) env_pointers.push_back(c_strings(env));

  SignalScope signals;
  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r)
    pids.push_back(
        start_rank(r, program, arg_pointers.data(), env_pointers[r].data(), signals.old_mask(), pids, options.grace));
  signals.release();
  return wait_for_ranks(pids, options.grace);
}

}  // namespace chiar::engine
