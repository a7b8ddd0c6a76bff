// A plugin whose registration function throws.
#include <stdexcept>

#include "chiar/plugin.h"

static void register_plugin(chiar::Registrar&) { throw std::runtime_error("cannot register today"); }

CHIAR_PLUGIN("operator", register_plugin)
