// An operator whose factory throws, and a router registered twice in one library.
#include <stdexcept>

#include "chiar/plugin.h"

static void register_plugin(chiar::Registrar& r) {
  r.add_operator("explode", "a factory that throws",
                 [](const chiar::OperatorSpec&) -> std::unique_ptr<chiar::Operator> {
                   throw std::runtime_error("boom");
                 });
}

CHIAR_PLUGIN("operator", register_plugin)
