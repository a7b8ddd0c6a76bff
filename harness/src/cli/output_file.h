#pragma once
// Files a command writes whole once its work is done: an export, a
// benchmark's JSON, an inspection page, a plan. A regular file (or a new
// one) is written to a temporary beside it and renamed into place, so a
// failure leaves the previous file or none, never a truncated one; anything
// else (/dev/stdout, a pipe) is written in place. Failures throw
// chiar::EnvironmentError "<path>: cannot write the file: <strerror>" (exit 3);
// a folder given as the file throws chiar::UserError (exit 2).
#include <string>

namespace chiar::cli {

// Checked before a long command starts, so that a path it cannot write
// fails before the work, not after: the file, or for a new one its folder,
// must be writable.
void check_output_file(const std::string& path);

// Writes `text` to `path` as above.
void write_output_file(const std::string& path, const std::string& text);

}  // namespace chiar::cli
