#include "chiar/error.h"

#include <new>

#include <c10/util/Exception.h>

namespace chiar {
namespace {

// The CPU allocator's words, the same in every libtorch this harness builds
// against; what follows them says how much was asked for and errno's text.
const char* const kCpuAllocator = "DefaultCPUAllocator: ";

// How a plain c10::Error says memory ran out: the CPU allocator, and on a GPU
// the CUDA runtime (an allocation outside the caching allocator) and the
// CUDA libraries' own workspaces, which libtorch reports by their status
// names (cuBLAS's handle and workspace, cuFFT's plans: the DCT and Fourier
// operators), not as c10::OutOfMemoryError.
const char* const kOutOfMemoryWords[] = {
    "DefaultCPUAllocator: can't allocate memory",
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUFFT_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
};

}  // namespace

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  // A negative or overflowing array length is a bug, not the machine.
  if (dynamic_cast<const std::bad_alloc*>(&e)) return !dynamic_cast<const std::bad_array_new_length*>(&e);
  if (!dynamic_cast<const c10::Error*>(&e)) return false;
  const std::string text = message_of(e);
  for (const char* words : kOutOfMemoryWords)
    if (text.find(words) != std::string::npos) return true;
  return false;
}

std::string out_of_memory_message(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e)) return "a host allocation failed (std::bad_alloc)";
  std::string text = message_of(e);
  // "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't
  // allocate memory: ...": the source location and condition say nothing to a user.
  if (const auto at = text.find(kCpuAllocator); at != std::string::npos)
    text = text.substr(at + std::char_traits<char>::length(kCpuAllocator));
  for (char& c : text)
    if (c == '\n') c = ' ';
  const auto end = text.find_last_not_of(' ');
  return end == std::string::npos ? text : text.substr(0, end + 1);
}

}  // namespace chiar
