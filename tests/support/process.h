#pragma once
// Runs the chiar CLI as a child process: to completion, or in the
// background to be signalled.
#include <sys/types.h>

#include <string>
#include <vector>

namespace chiar::test {

struct Finished {
  int status = -1;  // exit status, or 128 + signal
  std::string output;  // stdout and stderr together
};

// Runs `chiar args...` and waits.
Finished run_chiar(const std::vector<std::string>& args);

// Starts `chiar args...` with output to log_file; returns the pid.
pid_t spawn_chiar(const std::vector<std::string>& args, const std::string& log_file);
// Waits for a spawned child; exit status or 128 + signal.
int wait_chiar(pid_t pid);

}  // namespace chiar::test
