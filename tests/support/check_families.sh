#!/usr/bin/env bash
# Usage: check_families.sh CHIAR_TESTS FAMILIES_FILE
# Each line of FAMILIES_FILE is "name<TAB>Catch2 test spec", one per ctest
# entry. Fails, naming the test cases, unless every test case of CHIAR_TESTS
# (hidden ones included) is listed by exactly one family: a case in none would
# never run under ctest, a case in two would run twice.
set -euo pipefail
export LC_ALL=C  # sort and comm must agree on the order
tests=$1
families=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# "*" matches hidden test cases too.
"$tests" --list-test-names-only '*' | sed '/^$/d' | sort >"$work/all"
if [[ ! -s $work/all ]]; then
  echo "check_families: $tests lists no test cases" >&2
  exit 1
fi

: >"$work/claimed"
status=0
while IFS=$'\t' read -r name spec; do
  [[ -z $name ]] && continue
  "$tests" --list-test-names-only "$spec" | sed '/^$/d' >"$work/family"
  if [[ ! -s $work/family ]]; then
    echo "ctest family '$name' ($spec) selects no test case"
    status=1
  fi
  awk -v family="$name" '{ print $0 "\t" family }' "$work/family" >>"$work/claimed"
done <"$families"

cut -f1 "$work/claimed" | sort -u >"$work/claimed_names"
while IFS= read -r test_case; do
  echo "test case in no ctest family: $test_case"
  status=1
done < <(comm -23 "$work/all" "$work/claimed_names")
while IFS= read -r test_case; do
  owners=$(T="$test_case" awk -F'\t' '$1 == ENVIRON["T"] { printf "%s%s", sep, $2; sep = ", " }' "$work/claimed")
  echo "test case in several ctest families ($owners): $test_case"
  status=1
done < <(cut -f1 "$work/claimed" | sort | uniq -d)

if [[ $status -eq 0 ]]; then
  echo "$(wc -l <"$work/all") test cases, each in exactly one of $(grep -c . "$families") ctest families"
fi
exit "$status"
