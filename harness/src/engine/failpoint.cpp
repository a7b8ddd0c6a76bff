#include "failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace chiar::engine {
namespace {

struct Target {
  std::string name;     // "" when CHIAR_FAILPOINT is unset or malformed
  long hit = 0;         // the N of NAME:N
  long seen = 0;
  int signal = SIGKILL;  // SIGTERM for NAME:N:term
};

Target read_target() {
  Target t;
  const char* env = std::getenv("CHIAR_FAILPOINT");
  if (!env) return t;
  std::string spec = env;
  const std::string term = ":term";
  if (spec.size() > term.size() && spec.compare(spec.size() - term.size(), term.size(), term) == 0) {
    spec.resize(spec.size() - term.size());
    t.signal = SIGTERM;
  }
  const auto colon = spec.rfind(':');
  if (colon == std::string::npos) return t;
  char* end = nullptr;
  const long n = std::strtol(spec.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || n < 1) return t;
  t.name = spec.substr(0, colon);
  t.hit = n;
  return t;
}

}  // namespace

void failpoint(const char* name) {
  static Target target = read_target();
  if (target.name.empty() || target.name != name) return;
  if (++target.seen == target.hit) kill(getpid(), target.signal);
}

}  // namespace chiar::engine
