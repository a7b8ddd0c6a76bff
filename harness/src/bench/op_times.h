#pragma once
// Where a step's time goes, operator by operator. libtorch's RecordFunction
// callbacks see every operator call (aten:: ops, autograd nodes, and the
// harness's RECORD_FUNCTION scopes such as chiar::linear): each call's wall
// time, less the time of the calls made inside it, is its self time, kept
// per (operator, the nearest enclosing scope: not an aten:: operator, not
// the autograd engine's wrapper of a node), so a copy inside
// linear() and one inside attention's backward are told apart. Recording
// costs two clock reads and a map update per call: at the anchor shapes the
// recorded steps ran 6 ms (3-4%) longer than the timed ones, which is why
// bench-train records in steps of its own after the timed ones. libtorch's
// profiler, which keeps shapes and stacks, slowed a bf16 step from 194 to
// 450 ms.
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/record_function.h>

namespace chiar::bench {

struct OpTime {
  std::string op;     // aten::copy_, chiar::linear, an autograd node ...
  std::string scope;  // the nearest enclosing scope (see above), or ""
  double self_ms = 0, total_ms = 0;
  int64_t calls = 0;
};

// Records from construction to destruction, on every thread that calls
// operators; one at a time.
class OpRecorder {
 public:
  OpRecorder();
  ~OpRecorder();
  OpRecorder(const OpRecorder&) = delete;
  OpRecorder& operator=(const OpRecorder&) = delete;

  // What was recorded so far, largest self time first.
  std::vector<OpTime> times() const;

 private:
  at::CallbackHandle handle_;
};

}  // namespace chiar::bench
