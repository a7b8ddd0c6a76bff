#pragma once
// Files a command writes whole once its work is done: an export, a
// benchmark's JSON, an inspection page, a plan. Written in place, as any
// file a user names (a symbolic link's target, a bind-mounted file), keeping
// an existing file's mode; "/dev/stdout" and "-" are standard output itself,
// at its position. An existing file is emptied first, so a write that fails
// leaves it empty or part-written; a file the write made at the path itself
// (not a dangling link's target) is removed.
// Failures throw chiar::EnvironmentError "<path>: cannot write the file:
// <strerror>" (exit 3); a folder given as the file throws chiar::UserError
// (exit 2).
#include <string>

namespace chiar::cli {

// Checked before a long command starts, so that a path it cannot write
// fails before the work, not after: an existing file must be writable, and
// a new one's folder.
void check_output_file(const std::string& path);

// Writes `text` to `path` as above.
void write_output_file(const std::string& path, const std::string& text);

}  // namespace chiar::cli
