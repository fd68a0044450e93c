#!/usr/bin/env bash
# Every GPU test that scripts/gpu_check.sh names in a gtest filter must exist: gtest matches a
# stale name silently, so a renamed test would drop out of a device run (it did once: the
# memcheck subset named BiasGradPacksMatchTheScalarPath after its rename). Listing the tests
# needs no GPU. Usage: gpu_check_filters.sh SCRIPT TEST_BINARY...
set -euo pipefail
script=$1
shift
listed=$(mktemp)
trap 'rm -f "$listed"' EXIT
for bin in "$@"; do
  # --gtest_list_tests prints "Suite." lines, then indented test names (with "# GetParam" notes).
  "$bin" --gtest_list_tests | awk '/^[^ ]/ {suite = $1; next} {print suite $1}' >>"$listed"
done
[ -s "$listed" ] || { echo "no tests listed by $*" >&2; exit 1; }
# Suite(/param).Test names and Suite.* wildcards; then *Part* wildcards (a CamelCase part).
names=$(grep -oE "[A-Z][A-Za-z0-9_]*(/[a-z0-9]+)?\.[A-Z*][A-Za-z0-9_*]*" "$script" | sort -u)
parts=$(grep -oE "\*[A-Z][A-Za-z0-9_]+[/*]" "$script" | tr -d '/*' | sort -u)
[ -n "$names" ] || { echo "no test names found in $script" >&2; exit 1; }
missing=0 checked=0
for n in $names $parts; do
  checked=$((checked + 1))
  if [[ $n == *'*' ]]; then
    grep -qF "${n%\*}" "$listed" && continue  # a wildcard must match something
  elif [[ $n != *.* ]]; then
    grep -qF "$n" "$listed" && continue  # a part of a name
  else
    grep -qxF "$n" "$listed" && continue
  fi
  echo "$script names '$n', which no test binary has" >&2
  missing=$((missing + 1))
done
echo "$checked filter names checked, $missing missing"
[ "$missing" -eq 0 ]
