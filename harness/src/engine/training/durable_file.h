#pragma once
// Checkpoint files that survive a crash or a full disk: written whole to a
// temporary file, fsynced, renamed into place and the folder fsynced, so a
// reader sees either the previous file or the complete new one. The bytes
// carry a checksum the store records; a load verifies size and checksum
// before trusting the file.
//
// All file I/O here is our own: libtorch's file writer throws from a
// destructor when the disk fills, which aborts the process. Archives are
// serialised to memory and handed to write_durably.
#include <cstdint>
#include <stdexcept>
#include <string>

namespace chiar::engine {

// A checkpoint file that is missing, or whose size or checksum differs from
// what the store recorded. what() names the file and what is wrong with it:
//   "<path>: missing checkpoint (<strerror>)"
//   "<path>: truncated checkpoint (<found> of <recorded> bytes)"
//   "<path>: oversized checkpoint (<found> of <recorded> bytes)"
//   "<path>: checksum mismatch (recorded crc32:xxxxxxxx, found crc32:yyyyyyyy)"
class CorruptCheckpoint : public std::runtime_error {
 public:
  explicit CorruptCheckpoint(const std::string& message) : std::runtime_error(message) {}
};

// "crc32:%08x" of the bytes (zlib's CRC-32).
std::string crc32_of(const std::string& bytes);

// Writes `bytes` to path + ".tmp" (every byte, across EINTR and short
// writes), fsyncs and closes it, renames it to `path` and fsyncs the folder.
// Any failure throws chiar::EnvironmentError
//   "<file>: cannot write the checkpoint: <strerror>"
// naming the file that failed, and removes the temporary file.
void write_durably(const std::string& path, const std::string& bytes);

// The same for a file beside the checkpoints that is not one (a run's
// spec.toml): no crash point, and failures read
//   "<file>: cannot write the file: <strerror>".
void write_file_durably(const std::string& path, const std::string& bytes);

// The file's bytes once they match the recorded size and checksum; throws
// CorruptCheckpoint otherwise. A read error other than a missing file throws
// chiar::EnvironmentError ("<path>: cannot read the checkpoint: <strerror>").
std::string read_verified(const std::string& path, int64_t bytes, const std::string& checksum);

}  // namespace chiar::engine
