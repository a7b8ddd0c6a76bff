#include "failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace chiar::engine {
namespace {

struct Target {
  std::string name;  // "" when CHIAR_FAILPOINT is unset or malformed
  long hit = 0;      // the N of NAME:N
  long seen = 0;
};

Target read_target() {
  Target t;
  const char* spec = std::getenv("CHIAR_FAILPOINT");
  if (!spec) return t;
  const char* colon = std::strrchr(spec, ':');
  if (!colon) return t;
  char* end = nullptr;
  const long n = std::strtol(colon + 1, &end, 10);
  if (*end != '\0' || n < 1) return t;
  t.name.assign(spec, colon);
  t.hit = n;
  return t;
}

}  // namespace

void failpoint(const char* name) {
  static Target target = read_target();
  if (target.name.empty() || target.name != name) return;
  if (++target.seen == target.hit) kill(getpid(), SIGKILL);
}

}  // namespace chiar::engine
