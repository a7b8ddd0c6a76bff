#include "failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

namespace chiar::engine {
namespace {

enum class Action { Kill, Term, OutOfMemory, Throw };

struct Target {
  std::string name;  // "" when malformed
  long hit = 0;      // the N of NAME:N
  long seen = 0;
  Action action = Action::Kill;  // NAME:N, NAME:N:term, NAME:N:oom, NAME:N:throw
};

// Whether `spec` ends in `suffix`, which is then taken off it.
bool take_suffix(std::string& spec, const std::string& suffix) {
  if (spec.size() <= suffix.size() || spec.compare(spec.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  spec.resize(spec.size() - suffix.size());
  return true;
}

// One target of CHIAR_FAILPOINT, NAME:N[:ACTION]; its name is empty when malformed.
Target read_target(std::string spec) {
  Target t;
  if (take_suffix(spec, ":term"))
    t.action = Action::Term;
  else if (take_suffix(spec, ":oom"))
    t.action = Action::OutOfMemory;
  else if (take_suffix(spec, ":throw"))
    t.action = Action::Throw;
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos) return t;
  char* end = nullptr;
  const long n = std::strtol(spec.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || n < 1) return t;
  t.name = spec.substr(0, colon);
  t.hit = n;
  return t;
}

// The comma-separated targets of CHIAR_FAILPOINT, in its order.
std::vector<Target> read_targets() {
  std::vector<Target> targets;
  const char* env = std::getenv("CHIAR_FAILPOINT");
  if (!env) return targets;
  const std::string all = env;
  for (size_t at = 0; at <= all.size();) {
    const size_t comma = std::min(all.find(',', at), all.size());
    Target t = read_target(all.substr(at, comma - at));
    if (!t.name.empty()) targets.push_back(std::move(t));
    at = comma + 1;
  }
  return targets;
}

void act(Action action, const char* name) {
  switch (action) {
    case Action::Kill: kill(getpid(), SIGKILL); return;
    case Action::Term: kill(getpid(), SIGTERM); return;
    case Action::OutOfMemory:
      // The exception libtorch's CUDA allocator throws, on any device.
      TORCH_CHECK_WITH(OutOfMemoryError, false, "out of memory at failpoint ", name, " (CHIAR_FAILPOINT asked for it)");
      return;
    case Action::Throw:
      throw std::runtime_error(std::string("failure at failpoint ") + name + " (CHIAR_FAILPOINT asked for it)");
  }
}

}  // namespace

void failpoint(const char* name) {
  static std::vector<Target> targets = read_targets();
  // Every target counts its passes before any acts: with NAME:N:term,NAME:N:throw
  // the stop request comes first, then the throw.
  std::vector<Action> due;
  for (auto& t : targets)
    if (t.name == name && ++t.seen == t.hit) due.push_back(t.action);
  for (const Action action : due) act(action, name);
}

}  // namespace chiar::engine
