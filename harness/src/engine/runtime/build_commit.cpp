#include "engine/runtime/build_commit.h"

#include "chiar_build_commit.h"  // generated at every build (harness/cmake/build_commit.cmake)

namespace chiar::engine {

// Alone in its file: a new commit recompiles this and nothing else.
BuildCommit build_commit() { return {CHIAR_BUILD_COMMIT, CHIAR_BUILD_DIRTY != 0}; }

}  // namespace chiar::engine
