#pragma once
#include <stdexcept>
#include <string>

#include "chiar/export.h"

namespace chiar {

// Bad input from the user (config, data file, plugin, CLI argument). The CLI
// prints what() alone and exits with status 2; nothing is written anywhere.
class CHIAR_API UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message);
  ~UserError() override;
};

// The environment failed under a correct request: a full disk, a read-only
// or vanished folder, an I/O error, a dead peer. what() names the file and
// the cause; the CLI prints it alone and exits with status 3. Whatever was
// finished before stays intact, and rerunning the command resumes.
class CHIAR_API EnvironmentError : public std::runtime_error {
 public:
  explicit EnvironmentError(const std::string& message);
  ~EnvironmentError() override;
};

// e.what(), less the backtrace libtorch appends to its errors' what(): the
// text a message to a user may quote.
CHIAR_API std::string message_of(const std::exception& e);

// Whether `e` is an allocation that failed for lack of memory: libtorch's
// CUDA caching allocator (c10::OutOfMemoryError), its CPU allocator (a plain
// c10::Error, whose message has named "DefaultCPUAllocator: can't allocate
// memory" from libtorch 1.x through 2.x), the CUDA runtime's and the CUDA
// libraries' allocation statuses as libtorch reports them ("CUDA error: out
// of memory", CUBLAS_/CUFFT_/CUSOLVER_..._ALLOC_FAILED), or std::bad_alloc
// (not std::bad_array_new_length, a bug). Such a failure
// is the machine's, not the run's: the same run fits on a device with more
// memory (a run's device is not part of its hash), so the harness records it
// interrupted, to resume there, and the CLI exits 3. Code that catches
// exceptions to add context (a plugin's factory) rethrows these unchanged.
CHIAR_API bool is_out_of_memory(const std::exception& e);

// What ran out and how much was asked for, in one line without libtorch's
// backtrace or source location: "CUDA out of memory. Tried to allocate 2.00
// GiB. ...", "can't allocate memory: you tried to allocate 2199023255552
// bytes. Error code 12 (Cannot allocate memory)".
CHIAR_API std::string out_of_memory_message(const std::exception& e);

}  // namespace chiar
