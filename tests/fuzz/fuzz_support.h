#pragma once
// Shared by the fuzz targets: a scratch folder per process (on /dev/shm when
// it exists, so file-based readers stay fast), files written from the input,
// and the input split into parts on a separator line.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <boost/filesystem.hpp>

namespace chiar::fuzz {

// A line on its own that separates the parts of one input (several files).
inline const std::string kSeparator = "\n-----\n";

inline std::vector<std::string> split_parts(const std::string& input, size_t max_parts) {
  std::vector<std::string> parts;
  size_t from = 0;
  while (parts.size() + 1 < max_parts) {
    const size_t at = input.find(kSeparator, from);
    if (at == std::string::npos) break;
    parts.push_back(input.substr(from, at - from));
    from = at + kSeparator.size();
  }
  parts.push_back(input.substr(from));
  return parts;
}

// This process's scratch folder, removed at exit; emptied by fresh_dir().
class Scratch {
 public:
  Scratch() {
    const char* shm = "/dev/shm";
    boost::system::error_code ec;
    const std::string base =
        boost::filesystem::is_directory(shm, ec) ? shm : boost::filesystem::temp_directory_path().string();
    root_ = base + "/chiar-fuzz-" + std::to_string(::getpid());
    boost::filesystem::create_directories(root_);
  }
  ~Scratch() {
    boost::system::error_code ec;
    boost::filesystem::remove_all(root_, ec);
  }
  // An empty folder for one input.
  const std::string& fresh_dir() {
    boost::system::error_code ec;
    boost::filesystem::remove_all(root_ + "/in", ec);
    boost::filesystem::create_directories(root_ + "/in");
    dir_ = root_ + "/in";
    return dir_;
  }

 private:
  std::string root_, dir_;
};

inline Scratch& scratch() {
  static Scratch s;
  return s;
}

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) std::abort();  // the harness itself failed, not the reader
}

// A finding the sanitizers cannot see: a reader broke its own contract.
[[noreturn]] inline void contract_broken(const std::string& what) {
  std::fprintf(stderr, "fuzz contract broken: %s\n", what.c_str());
  std::abort();
}

}  // namespace chiar::fuzz
