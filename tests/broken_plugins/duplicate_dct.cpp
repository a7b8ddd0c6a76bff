// Registers an operator under a name the in-tree dct plugin already owns.
#include <ATen/ATen.h>

#include "chiar/plugin.h"

static void register_plugin(chiar::Registrar& r) {
  r.add_operator("dct", "a second dct",
                 [](const chiar::OperatorSpec&) -> std::unique_ptr<chiar::Operator> { return nullptr; });
}

CHIAR_PLUGIN("operator", register_plugin)
