// Operators whose factories throw: a plain exception, a libtorch error (its
// backtrace must not reach the message) and libtorch's out-of-memory error
// (which the registry lets through unwrapped).
#include <stdexcept>

#include <c10/util/Exception.h>

#include "chiar/plugin.h"

static void register_plugin(chiar::Registrar& r) {
  r.add_operator(
      "explode", "a factory that throws",
      [](const chiar::OperatorSpec&) -> std::unique_ptr<chiar::Operator> { throw std::runtime_error("boom"); });
  r.add_operator("explode_in_torch", "a factory that fails a libtorch check",
                 [](const chiar::OperatorSpec& spec) -> std::unique_ptr<chiar::Operator> {
                   TORCH_CHECK(spec.d_model < 0, "boom in libtorch");
                   return nullptr;
                 });
  r.add_operator("runs_out", "a factory that runs out of GPU memory",
                 [](const chiar::OperatorSpec& spec) -> std::unique_ptr<chiar::Operator> {
                   TORCH_CHECK_WITH(OutOfMemoryError, spec.d_model < 0,
                                    "CUDA out of memory. Tried to allocate 1.00 GiB");
                   return nullptr;
                 });
}

CHIAR_PLUGIN("operator", register_plugin)
