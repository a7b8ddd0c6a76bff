#pragma once
// What `chiar run` (a dry run too) and `chiar slurm` check of a matrix's runs
// against the loaded plugins before anything is written, listed or
// submitted: what a run would refuse when it builds its task and probes its
// model, less what needs the task's data (its vocabulary, and whether it is
// language modelling, which some operators refuse).
#include "chiar/registry.h"
#include "engine/config/matrix.h"

namespace chiar::cli {

// Throws UserError for the first run whose task plugin, operators, or router
// (where a layer is routed) no loaded plugin registers; whose task options
// its plugin does not declare or of another kind; or whose operators or
// router refuse their options when made (each layer's, once per distinct
// model). Named where the value was set (Matrix::origin_of): "--set
// model.layers: unknown operator 'atn' (known: ...)", "m.toml:21:1: key
// 'variants.base.layers': ...", "--set router.colour: router 'threshold'
// (...): unknown parameter 'colour'".
void check_against_plugins(const engine::Matrix& matrix, const PluginRegistry& registry);

}  // namespace chiar::cli
