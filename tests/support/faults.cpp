#include "faults.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "engine/store/sqlite.h"

extern char** environ;

namespace chiar::test {

namespace {

// This process's environment with `extra` ("NAME=value") appended. getenv
// returns the first entry of a name, so the names `extra` sets are left out
// of the copy.
std::vector<std::string> environment_with(const std::vector<std::string>& extra) {
  std::vector<std::string> names;
  for (const auto& e : extra) names.push_back(e.substr(0, e.find('=') + 1));
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool overridden = false;
    for (const auto& n : names) overridden |= entry.compare(0, n.size(), n) == 0;
    if (!overridden) env.push_back(entry);
  }
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

std::vector<char*> pointers_to(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

std::string tmpfs_options(int64_t bytes) { return "size=" + std::to_string(bytes); }

}  // namespace

pid_t spawn_chiar_with_env(const std::vector<std::string>& args, const std::string& log_file,
                           const std::vector<std::string>& environment) {
  std::vector<std::string> argv_strings = {CHIAR_CLI};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<std::string> env_strings = environment_with(environment);
  const std::vector<char*> argv = pointers_to(argv_strings);
  const std::vector<char*> envp = pointers_to(env_strings);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  return pid;
}

bool child_exited(pid_t pid, int* status) {
  int raw = 0;
  if (waitpid(pid, &raw, WNOHANG) != pid) return false;
  *status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
  return true;
}

TmpfsMount::TmpfsMount(const std::string& folder, int64_t bytes) : folder_(folder) {
  if (::mount("tmpfs", folder_.c_str(), "tmpfs", 0, tmpfs_options(bytes).c_str()) != 0)
    throw std::runtime_error("mount tmpfs on " + folder_ + ": " + std::strerror(errno));
  mounted_ = true;
}

TmpfsMount::~TmpfsMount() {
  if (mounted_) ::umount2(folder_.c_str(), MNT_DETACH);
}

void TmpfsMount::resize(int64_t bytes) {
  if (::mount("tmpfs", folder_.c_str(), "tmpfs", MS_REMOUNT, tmpfs_options(bytes).c_str()) != 0)
    throw std::runtime_error("remount " + folder_ + " with " + tmpfs_options(bytes) + ": " + std::strerror(errno));
}

void TmpfsMount::make_read_only() {
  if (::mount("tmpfs", folder_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) != 0)
    throw std::runtime_error("remount " + folder_ + " read-only: " + std::strerror(errno));
}

bool TmpfsMount::available() {
  if (geteuid() != 0) return false;
  char scratch[] = "/tmp/chiar-tmpfs-probe-XXXXXX";
  if (mkdtemp(scratch) == nullptr) return false;
  const bool mounted = ::mount("tmpfs", scratch, "tmpfs", 0, "size=64k") == 0;
  if (mounted) ::umount2(scratch, MNT_DETACH);
  ::rmdir(scratch);
  return mounted;
}

std::string integrity_check(const std::string& db) {
  // Opened as the read-only commands open a store (immutable at rest), so a
  // read-only mount can be checked too.
  try {
    engine::Database con(db, engine::OpenMode::ReadOnly);
    auto q = con.prepare("PRAGMA integrity_check");
    std::string rows;
    while (q.step()) {
      if (!rows.empty()) rows += '\n';
      rows += q.text(0);
    }
    return rows;
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::string read_text(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

bool has_line(const std::string& output, const std::string& line) {
  return ("\n" + output).find("\n" + line + "\n") != std::string::npos;
}

}  // namespace chiar::test
