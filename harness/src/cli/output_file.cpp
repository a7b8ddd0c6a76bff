#include "output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "chiar/error.h"
#include "engine/training/durable_file.h"

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

// stat()'s answer for the path: true when it exists.
bool existing(const std::string& path, struct stat& st) {
  if (::stat(path.c_str(), &st) == 0) return true;
  if (errno != ENOENT) fail(path, errno);
  return false;
}

void write_in_place(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
  if (fd < 0) fail(path, errno);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      fail(path, e);
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) fail(path, errno);
}

}  // namespace

void check_output_file(const std::string& path) {
  struct stat st {};
  if (existing(path, st)) {
    if (S_ISDIR(st.st_mode)) throw UserError(path + ": is a folder; give the path of a file");
    if (::access(path.c_str(), W_OK) != 0) fail(path, errno);
    if (!S_ISREG(st.st_mode)) return;  // a device or pipe: written in place
  }
  // A regular or new file is renamed into place from a temporary beside it.
  if (::access(folder_of(path).c_str(), W_OK | X_OK) != 0) fail(path, errno);
}

void write_output_file(const std::string& path, const std::string& text) {
  check_output_file(path);
  struct stat st {};
  if (existing(path, st) && !S_ISREG(st.st_mode)) return write_in_place(path, text);
  engine::write_file_durably(path, text);
}

}  // namespace chiar::cli
