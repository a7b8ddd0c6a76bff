#!/usr/bin/env bash
# The plugin SDK's boundary: libchiar_core.so exports and installs the public
# API (harness/include/chiar) and nothing of the application (model assembly,
# engine, report, bench, CLI), which lives in the static chiar_app.
# Usage: check_sdk_boundary.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1
build=$2
failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }

# 1. Private headers never export: CHIAR_API belongs to the public headers.
while IFS= read -r hit; do
  fail "private header exports a symbol (CHIAR_API outside harness/include): $hit"
done < <(grep -rn --include='*.h' 'CHIAR_API' "$src/harness/src" | sed "s|^$src/||")

# 2. Public headers include only libtorch, the standard library and each other.
while IFS= read -r hit; do
  fail "public header includes a private one: $hit"
done < <(grep -rnE '^#include "' "$src/harness/include/chiar" | grep -vE '#include "chiar/' | sed "s|^$src/||")

# 3. Application code declares in a namespace of its own folder's (chiar::model,
#    chiar::engine, chiar::report, chiar::cli, chiar::bench): a `namespace
#    chiar {` block there may only forward-declare the SDK's classes.
app_dirs=(model engine report cli bench)
while IFS= read -r hit; do
  fail "application code declares in namespace chiar (use its folder's namespace): $hit"
done < <(for d in "${app_dirs[@]}"; do
           find "$src/harness/src/$d" -name '*.h' -o -name '*.cpp' -o -name '*.cu'
         done | xargs awk '/^namespace chiar \{/ {inside = 1; next}
                            inside && /^\}/ {inside = 0; next}
                            inside && !/^(class|struct) [A-Za-z_]+;$/ && !/^[[:space:]]*$/ {print FILENAME ":" FNR ": " $0}' |
         sed "s|^$src/||")

# 4. The core library exports no application symbol: nothing of those namespaces.
app_namespaces=$(IFS='|'; echo "${app_dirs[*]}")
core=$build/libchiar_core.so
if [ ! -f "$core" ]; then
  fail "$core is missing"
else
  while IFS= read -r sym; do
    fail "libchiar_core.so exports an application symbol: $sym"
  done < <(nm -D --defined-only "$core" | c++filt |
           grep -E "chiar::($app_namespaces)::" | head -20)
fi

# 5. The installed tree holds exactly the public headers and no application library.
prefix=$(mktemp -d "${TMPDIR:-/tmp}/chiar-sdk-install.XXXXXX")
trap 'rm -rf "$prefix"' EXIT
if ! cmake --install "$build" --prefix "$prefix" >"$prefix.log" 2>&1; then
  fail "cmake --install failed:"; cat "$prefix.log"
else
  installed=$(cd "$prefix/include/chiar" 2>/dev/null && find . -type f | sort)
  public=$(cd "$src/harness/include/chiar" && find . -type f | sort)
  if [ "$installed" != "$public" ]; then
    fail "installed headers differ from harness/include/chiar:"
    diff <(echo "$public") <(echo "$installed") | sed 's/^/  /'
  fi
  app=$(find "$prefix" -name 'libchiar_app*' | sed "s|^$prefix/||")
  [ -z "$app" ] || fail "the application library is installed: $app"
fi
rm -f "$prefix.log"

if [ "$failures" -gt 0 ]; then
  echo "$failures boundary check(s) failed"
  exit 1
fi
echo "SDK boundary: private headers export nothing, application code declares in its own namespaces, public headers are self-contained, libchiar_core.so exports no application symbol, the install holds the public headers only"
