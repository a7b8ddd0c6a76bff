#pragma once
// chiar run --decide: the matrix in rounds of seeds by a group-sequential
// design, its looks recorded in the store (docs/usage.md#seeds-by-design).
#include "commands.h"
#include "engine/config/matrix.h"
#include "engine/runner.h"

namespace chiar {
class PluginRegistry;
}

namespace chiar::cli {

// Runs the rounds not yet run (a rerun resumes at the round it stopped in)
// and returns the exit status: 0 when the design is done, else what the
// round's runs returned (130 interrupted, 3 a failing environment).
int run_sequential(const RunArgs& a, const engine::Matrix& matrix, const PluginRegistry& registry,
                   const engine::RunnerOptions& options);

// One Slurm array task's part of the current round (--round-from DESIGN):
// the runs of the round, read from the design store `chiar slurm --decide`
// keeps, that fall in this task's shard of the matrix. `matrix` is the whole
// matrix (its seeds define the rounds), `shard` the task's part.
class SequentialRounds;
// Opens (creating its folder) the store `db` for a design: refused when it
// holds runs but no design, or another design; the design saved, its looks
// read into `rounds`.
void open_design(const std::string& db, SequentialRounds& rounds);

int run_sequential_round(const RunArgs& a, const engine::Matrix& matrix, const engine::Matrix& shard,
                         const PluginRegistry& registry, const engine::RunnerOptions& options);

}  // namespace chiar::cli
