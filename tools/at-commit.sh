#!/usr/bin/env bash
# Runs chiar as built from one commit, whatever the working tree holds now:
# a matrix that spans several sittings (configs/repro.toml) must run every
# sitting with the same clean commit's binary, or `chiar report` refuses its
# verdicts as mixed code. The commit is checked out once, detached, into
# build-at/<commit>/ (a git worktree, so the binary records it as clean) and
# built there; the command runs from the current folder, so relative paths
# (results/, .cache/, ../shared/data) mean what they mean here.
# Usage: tools/at-commit.sh COMMIT CHIAR-ARGS...
#   tools/at-commit.sh eebaf4b --gemm onednn run configs/repro.toml \
#       --decide configs/claims.toml --rounds 2
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: tools/at-commit.sh COMMIT CHIAR-ARGS..." >&2; exit 2; }
top=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=$(git -C "$top" rev-parse --verify --quiet "$1^{commit}") || {
  echo "tools/at-commit.sh: '$1' is not a commit of $top" >&2
  exit 2
}
shift
tree="$top/build-at/${commit:0:12}"
if [ ! -d "$tree" ]; then
  git -C "$top" worktree prune
  git -C "$top" worktree add --detach "$tree" "$commit" >/dev/null
fi
"$tree/tools/build.sh" chiar_runtime >&2
exec "$tree/build/chiar" "$@"
