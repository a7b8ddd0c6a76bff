#pragma once
// Tools of the fault-injection tests (test_faults.cpp): a CLI child with an
// environment of its own (CHIAR_FAILPOINT), tmpfs mounts that fill up or turn
// read-only, and a store's integrity check.
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace chiar::test {

// Like spawn_chiar, with `environment` ("NAME=value") added to this
// process's environment for the child alone. The child's environment is
// built before fork, so the child only redirects and execs.
pid_t spawn_chiar_with_env(const std::vector<std::string>& args, const std::string& log_file,
                           const std::vector<std::string>& environment);

// Whether the child has exited; if so, its status (exit status, or 128 +
// signal) is in *status and the child is reaped.
bool child_exited(pid_t pid, int* status);

// A tmpfs of `bytes` mounted on an existing folder for the guard's life.
// Unmounted (lazily, so an open file cannot keep it) by the destructor, also
// when a test fails. Mounting needs root: check available() first.
class TmpfsMount {
 public:
  TmpfsMount(const std::string& folder, int64_t bytes);
  ~TmpfsMount();
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;

  // `mount -o remount,size=bytes`: frees space (or takes it away).
  void resize(int64_t bytes);
  // `mount -o remount,ro`.
  void make_read_only();

  // Whether this process may mount a tmpfs here (root, and a kernel that lets
  // it): tries a mount on a scratch folder and undoes it.
  static bool available();

 private:
  std::string folder_;
  bool mounted_ = false;
};

// SQLite's `PRAGMA integrity_check`, its rows joined by newlines: "ok" for a
// sound database. Opens the file read-only.
std::string integrity_check(const std::string& db);

// The whole file, or "" when it cannot be read.
std::string read_text(const std::string& file);

// Occurrences of `needle` in `text`.
size_t occurrences(const std::string& text, const std::string& needle);

// Whether `line` is one whole line of `output`.
bool has_line(const std::string& output, const std::string& line);

}  // namespace chiar::test
