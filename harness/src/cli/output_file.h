#pragma once
// Files a command writes whole once its work is done: an export, a
// benchmark's JSON, an inspection page, a plan. Written in place, as any
// file a user names (a symbolic link's target, a bind-mounted file,
// /dev/stdout), keeping an existing file's mode. Failures throw
// chiar::EnvironmentError "<path>: cannot write the file: <strerror>" (exit 3)
// and leave no file where there was none; a folder given as the file throws
// chiar::UserError (exit 2).
#include <string>

namespace chiar::cli {

// Checked before a long command starts, so that a path it cannot write
// fails before the work, not after: an existing file must be writable, and
// a new one's folder.
void check_output_file(const std::string& path);

// Writes `text` to `path` as above.
void write_output_file(const std::string& path, const std::string& text);

}  // namespace chiar::cli
