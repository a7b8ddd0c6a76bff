#pragma once
// A run's status, as the store's runs.status column holds it (the column's
// CHECK constraint lists the same names). The trainer ends a run Done,
// Diverged or Interrupted; the runner adds Failed; the store keeps Pending and
// Running for runs not yet finished.
#include <string>

namespace chiar::engine {

enum class RunStatus { Pending, Running, Done, Failed, Diverged, Interrupted };

// The column's text: "pending", "running", "done", ...
const char* to_string(RunStatus s);

// The status behind a column's text; throws std::logic_error for any other
// text (the CHECK constraint keeps others out of a store).
RunStatus run_status_from_string(const std::string& text);

// Finished for good: a later `chiar run` skips it. An interrupted run is not:
// it resumes from its checkpoint.
inline bool is_final(RunStatus s) { return s == RunStatus::Done || s == RunStatus::Failed || s == RunStatus::Diverged; }

}  // namespace chiar::engine
