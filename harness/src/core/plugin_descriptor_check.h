#pragma once
// The checks the registry makes on a plugin's descriptor before any plugin
// code runs, as a function of their own so the fuzzer (tests/fuzz) can feed
// them arbitrary descriptors without building a library per case.
#include <string>

#include "chiar/plugin.h"

namespace chiar {

// Throws a UserError naming `file` when the descriptor is missing, was built
// for another plugin API or libtorch version, or has no register function.
// torch_version and kinds, when not null, are NUL-terminated strings.
void check_plugin_descriptor(const std::string& file, const chiar_plugin_descriptor* d);

}  // namespace chiar
