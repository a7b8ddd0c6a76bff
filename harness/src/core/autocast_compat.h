#pragma once
// libtorch 2.4 replaced the per-device autocast switches (is_cpu_enabled,
// set_autocast_cpu_dtype, ...) by ones that take the device, and deprecated
// the old. The harness builds warning-free against 1.13 and newer releases
// through these.
#include <ATen/autocast_mode.h>

#include "chiar/torch_version.h"

namespace chiar::autocast {

// Whether CPU or CUDA autocast is on in this thread.
inline bool any_enabled() {
#if CHIAR_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(at::kCPU) || at::autocast::is_autocast_enabled(at::kCUDA);
#else
  return at::autocast::is_cpu_enabled() || at::autocast::is_enabled();
#endif
}

// The type autocast computes in on `type`'s device (the CPU or CUDA) in this
// thread, or Undefined when it is off there.
inline at::ScalarType enabled_dtype(at::DeviceType type) {
#if CHIAR_TORCH_AT_LEAST(2, 4)
  return at::autocast::is_autocast_enabled(type) ? at::autocast::get_autocast_dtype(type) : at::ScalarType::Undefined;
#else
  if (type == at::kCUDA)
    return at::autocast::is_enabled() ? at::autocast::get_autocast_gpu_dtype() : at::ScalarType::Undefined;
  return at::autocast::is_cpu_enabled() ? at::autocast::get_autocast_cpu_dtype() : at::ScalarType::Undefined;
#endif
}

// Switches autocast on `type`'s device (the CPU or CUDA) on (to dtype) or off.
inline void set(at::DeviceType type, bool on, at::ScalarType dtype = at::kBFloat16) {
#if CHIAR_TORCH_AT_LEAST(2, 4)
  at::autocast::set_autocast_enabled(type, on);
  if (on) at::autocast::set_autocast_dtype(type, dtype);
#else
  if (type == at::kCUDA) {
    at::autocast::set_enabled(on);
    if (on) at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_cpu_enabled(on);
    if (on) at::autocast::set_autocast_cpu_dtype(dtype);
  }
#endif
}

inline void set_cpu(bool on, at::ScalarType dtype = at::kBFloat16) { set(at::kCPU, on, dtype); }

// bf16 autocast on `device`'s type for a scope (the forward pass; master
// weights and the optimiser stay fp32); nothing when `on` is false.
class Bf16Scope {
 public:
  Bf16Scope(bool on, const at::Device& device) : on_(on), type_(device.is_cuda() ? at::kCUDA : at::kCPU) {
    if (!on_) return;
    set(type_, true, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~Bf16Scope() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(type_, false);
  }
  Bf16Scope(const Bf16Scope&) = delete;
  Bf16Scope& operator=(const Bf16Scope&) = delete;

 private:
  bool on_;
  at::DeviceType type_;
};

// Autocast off on `device`'s type for a scope, and back as it was after: a
// value that a bf16 forward must compute in fp32 (the router's spectrum).
class Fp32Scope {
 public:
  explicit Fp32Scope(const at::Device& device)
      : type_(device.is_cuda() ? at::kCUDA : at::kCPU), dtype_(enabled_dtype(type_)) {
    if (dtype_ != at::ScalarType::Undefined) set(type_, false);
  }
  ~Fp32Scope() {
    if (dtype_ != at::ScalarType::Undefined) set(type_, true, dtype_);
  }
  Fp32Scope(const Fp32Scope&) = delete;
  Fp32Scope& operator=(const Fp32Scope&) = delete;

 private:
  at::DeviceType type_;
  at::ScalarType dtype_;  // what autocast computed in on entry; Undefined: it was off
};

}  // namespace chiar::autocast
