#pragma once
// Runs the chiar CLI as a child process: to completion, or in the
// background to be signalled.
#include <sys/types.h>

#include <string>
#include <vector>

namespace chiar::test {

struct Finished {
  int status = -1;     // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
};

// Runs `chiar args...` and waits.
Finished run_chiar(const std::vector<std::string>& args);

// Starts `chiar args...` with output to log_file; returns the pid.
pid_t spawn_chiar(const std::vector<std::string>& args, const std::string& log_file);
// Waits for a spawned child; exit status or 128 + signal.
int wait_chiar(pid_t pid);

// A finished child with what it cost.
struct Measured {
  int status = -1;         // exit status, or 128 + signal
  double seconds = 0;      // wall clock from fork to exit
  double peak_rss_mb = 0;  // the child's maximum resident set (getrusage's ru_maxrss)
};

// Runs `chiar args...` with output to log_file, and measures it.
Measured run_chiar_measured(const std::vector<std::string>& args, const std::string& log_file);

// The first line of a command's output that contains `part`, without its
// newline; "" if none does.
std::string line_with(const std::string& output, const std::string& part);

}  // namespace chiar::test
