// Declares only operators, then registers a router.
#include "chiar/plugin.h"

static void register_plugin(chiar::Registrar& r) {
  r.add_router("sneaky", "a router from an operator plugin",
               [](const chiar::RouterSpec&) -> std::unique_ptr<chiar::Router> { return nullptr; });
}

CHIAR_PLUGIN("operator", register_plugin)
