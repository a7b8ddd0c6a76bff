#include "output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>

#include "chiar/error.h"

namespace chiar::cli {
namespace {

[[noreturn]] void fail(const std::string& path, int error) {
  throw EnvironmentError(path + ": cannot write the file: " + std::strerror(error));
}

// The folder a new file would go into, as a path access() can test ("."
// for a bare name; "dir/." so that a regular file named as a folder fails
// with ENOTDIR).
std::string folder_of(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return (slash == 0 ? std::string("/") : path.substr(0, slash)) + "/.";
}

// Whether the path exists (following links), with stat()'s answer in `st`.
bool existing(const std::string& path, struct stat& st) {
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno != ENOENT) fail(path, errno);
  return false;
}

// Standard output, where a user names it as the file: written through the
// stream the command's other output goes to, at its position (a file
// reopened by name would be written from its start).
bool is_standard_output(const std::string& path) { return path == "-" || path == "/dev/stdout"; }

}  // namespace

void check_output_file(const std::string& path) {
  if (is_standard_output(path)) return;
  struct stat st {};
  if (!existing(path, st)) {
    if (::access(folder_of(path).c_str(), W_OK | X_OK) != 0) fail(path, errno);
    return;
  }
  if (S_ISDIR(st.st_mode)) throw UserError(path + ": is a folder; give the path of a file");
  if (::access(path.c_str(), W_OK) != 0) fail(path, errno);
}

void write_output_file(const std::string& path, const std::string& text) {
  if (is_standard_output(path)) {
    if (!(std::cout << text).flush()) fail("standard output", errno);
    return;
  }
  check_output_file(path);
  // lstat: a dangling link is there too, and is not to be removed.
  struct stat st {};
  const bool was_there = ::lstat(path.c_str(), &st) == 0;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) fail(path, errno);
  // A file this call made goes again when it cannot be finished.
  const auto give_up = [&](int error) {
    ::close(fd);
    if (!was_there) ::unlink(path.c_str());
    fail(path, error);
  };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) give_up(errno);
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const int error = errno;
    if (!was_there) ::unlink(path.c_str());
    fail(path, error);
  }
}

}  // namespace chiar::cli
