// A well-formed plugin whose reported versions come from compile definitions,
// so the tests can build API and libtorch mismatches.
#include "chiar/plugin.h"

static void register_nothing(chiar::Registrar&) {}

CHIAR_PLUGIN("operator", register_nothing)
