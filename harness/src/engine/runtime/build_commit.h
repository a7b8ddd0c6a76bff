#pragma once
// The commit this binary was built from, read from git at build time. Runs
// record it, so a result names the code that produced it wherever the binary
// runs from and whatever the checkout holds by then.
#include <string>

namespace chiar::engine {

struct BuildCommit {
  std::string commit;  // full hash; "" when the sources were not a git checkout
  bool dirty = false;  // tracked files differed from the commit when it was built
};

BuildCommit build_commit();

}  // namespace chiar::engine
