#include "checkpoint_dir.h"

#include <sys/statvfs.h>

#include <cstdio>
#include <iostream>

#include <boost/filesystem.hpp>

#include "chiar/error.h"
#include "engine/training/durable_file.h"

namespace chiar::engine {

void prepare_checkpoint_dir(const RunSpec& spec, const std::string& dir) {
  boost::system::error_code ec;
  boost::filesystem::create_directories(dir, ec);
  if (ec) throw EnvironmentError(dir + ": cannot create the checkpoint folder: " + ec.message());
  if (!spec.resolved_toml.empty()) write_file_durably(dir + "/spec.toml", spec.resolved_toml);
}

namespace {

std::string format_bytes(double bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  size_t u = 0;
  while (bytes >= 1024 && u + 1 < sizeof units / sizeof *units) {
    bytes /= 1024;
    ++u;
  }
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return text;
}

}  // namespace

void warn_if_short_of_space(const std::string& dir, int64_t params) {
  struct statvfs fsinfo {};
  if (::statvfs(dir.c_str(), &fsinfo) != 0) return;  // a real problem surfaces at the first write
  const double free_bytes = static_cast<double>(fsinfo.f_bavail) * static_cast<double>(fsinfo.f_frsize);
  const double needed = static_cast<double>(params) * sizeof(float) * (3 + 1);
  if (free_bytes < needed)
    std::cerr << "warning: " << dir << ": " << format_bytes(free_bytes) << " free, the next checkpoints need about "
              << format_bytes(needed) << "\n";
}

}  // namespace chiar::engine
