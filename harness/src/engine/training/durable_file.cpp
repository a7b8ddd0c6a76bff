#include "durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "chiar/error.h"
#include "engine/runtime/failpoint.h"

namespace chiar::engine {
namespace {

std::string write_failure(const std::string& file, const std::string& noun, int error) {
  return file + ": cannot write " + noun + ": " + std::strerror(error);
}

std::string folder_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// An open descriptor closed on every path out; close() errors matter only
// where the caller checks them through release_and_close.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes now and returns close()'s errno, or 0: a deferred write error
  // (NFS, some full disks) surfaces only here.
  int release_and_close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

// Every byte, across interrupted and short writes; errno on failure, else 0.
int write_all(int fd, const std::string& bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return ENOSPC;  // no progress and no error: treat as a full device
    p += n;
    left -= static_cast<size_t>(n);
  }
  return 0;
}

// Writes, syncs and closes the temporary file; errno of the first failure, else 0.
int write_temporary(const std::string& tmp, const std::string& bytes) {
  Descriptor fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return errno;
  if (const int e = write_all(fd.get(), bytes)) return e;
  if (::fsync(fd.get()) != 0) return errno;
  return fd.release_and_close();
}

// Makes the rename itself durable. A file system that cannot sync a folder
// (EINVAL) gives no better guarantee, so that is not a failure.
int sync_folder(const std::string& folder) {
  Descriptor fd(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return errno;
  if (::fsync(fd.get()) != 0 && errno != EINVAL) return errno;
  return fd.release_and_close();
}

}  // namespace

std::string crc32_of(const std::string& bytes) {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(bytes.data());
  size_t left = bytes.size();
  while (left > 0) {  // zlib takes a uInt length: feed files over 4 GiB in parts
    const auto n = static_cast<uInt>(std::min<size_t>(left, std::numeric_limits<uInt>::max()));
    crc = ::crc32(crc, p, n);
    p += n;
    left -= n;
  }
  char text[16];
  std::snprintf(text, sizeof text, "crc32:%08lx", static_cast<unsigned long>(crc));
  return text;
}

namespace {

// write_durably's steps; `noun` names what the file is in the message, and
// a checkpoint passes the crash point between its fsync and its rename.
void write_whole_file(const std::string& path, const std::string& bytes, const std::string& noun, bool checkpoint) {
  const std::string tmp = path + ".tmp";
  if (const int e = write_temporary(tmp, bytes)) {
    ::unlink(tmp.c_str());
    throw EnvironmentError(write_failure(tmp, noun, e));
  }
  if (checkpoint) failpoint("checkpoint.written");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw EnvironmentError(write_failure(path, noun, e));
  }
  const std::string folder = folder_of(path);
  if (const int e = sync_folder(folder)) throw EnvironmentError(write_failure(folder, noun, e));
}

}  // namespace

void write_durably(const std::string& path, const std::string& bytes) {
  write_whole_file(path, bytes, "the checkpoint", true);
}

void write_file_durably(const std::string& path, const std::string& bytes) {
  write_whole_file(path, bytes, "the file", false);
}

std::string read_verified(const std::string& path, int64_t bytes, const std::string& checksum) {
  Descriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int e = errno;
    if (e == ENOENT) throw CorruptCheckpoint(path + ": missing checkpoint (" + std::strerror(e) + ")");
    throw EnvironmentError(path + ": cannot read the checkpoint: " + std::strerror(e));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw EnvironmentError(path + ": cannot read the checkpoint: " + std::strerror(errno));
  const int64_t found = static_cast<int64_t>(st.st_size);
  if (found != bytes)
    throw CorruptCheckpoint(path + (found < bytes ? ": truncated" : ": oversized") + " checkpoint (" +
                            std::to_string(found) + " of " + std::to_string(bytes) + " bytes)");
  std::string data(static_cast<size_t>(found), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd.get(), &data[got], data.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw EnvironmentError(path + ": cannot read the checkpoint: " + std::strerror(errno));
    if (n == 0) break;  // shrank since fstat
    got += static_cast<size_t>(n);
  }
  if (got != data.size())
    throw CorruptCheckpoint(path + ": truncated checkpoint (" + std::to_string(got) + " of " + std::to_string(bytes) +
                            " bytes)");
  const std::string actual = crc32_of(data);
  if (actual != checksum)
    throw CorruptCheckpoint(path + ": checksum mismatch (recorded " + checksum + ", found " + actual + ")");
  return data;
}

}  // namespace chiar::engine
