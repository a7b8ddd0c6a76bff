#include "process.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>

namespace chiar::test {

pid_t spawn_chiar(const std::vector<std::string>& args, const std::string& log_file) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    std::vector<char*> argv;
    std::string cli = CHIAR_CLI;
    argv.push_back(cli.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(cli.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

namespace {

// A wait status as a shell says it: the exit status, or 128 + the signal.
int exit_status(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

}  // namespace

int wait_chiar(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return exit_status(status);
}

Measured run_chiar_measured(const std::vector<std::string>& args, const std::string& log_file) {
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = spawn_chiar(args, log_file);
  int status = 0;
  rusage usage{};
  wait4(pid, &status, 0, &usage);
  Measured m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  m.status = exit_status(status);
  m.peak_rss_mb = static_cast<double>(usage.ru_maxrss) / 1024.0;  // kilobytes on Linux
  return m;
}

Finished run_chiar(const std::vector<std::string>& args) {
  char name[] = "/tmp/chiar-test-log-XXXXXX";
  const int fd = mkstemp(name);
  close(fd);
  Finished f;
  f.status = wait_chiar(spawn_chiar(args, name));
  std::ifstream in(name);
  std::stringstream s;
  s << in.rdbuf();
  f.output = s.str();
  unlink(name);
  return f;
}

std::string line_with(const std::string& output, const std::string& part) {
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (line.find(part) != std::string::npos) return line;
  return "";
}

}  // namespace chiar::test
