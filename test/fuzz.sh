#!/usr/bin/env bash
# Runs every fuzz target of the main module for $FUZZTIME (default 3s) each, with $FUZZ_WORKERS
# workers (default: one per CPU; make check uses 1 beside the end-to-end tests). The committed seed
# corpora under testdata/fuzz also run as plain tests in `go test ./...`.
#
# A finding always writes its input under testdata/fuzz and fails. The engine alone can also fail
# at the -fuzztime boundary with "context deadline exceeded" and no input written
# (golang/go#51484); such a run is repeated once, and a second failure fails.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-3s}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

workers=${FUZZ_WORKERS:-0} # 0: the engine's default, one per CPU

fuzz_once() { # pkg name
  local parallel=()
  [ "$workers" != 0 ] && parallel=(-parallel "$workers")
  go test -run='^$' -fuzz="^$2\$" -fuzztime="$fuzztime" "${parallel[@]}" "$1" >"$log" 2>&1
}

engine_flake() {
  grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log"
}

n=0
while IFS=: read -r file name; do
  pkg=./$(dirname "$file")
  echo "fuzz $pkg $name ($fuzztime)"
  if ! fuzz_once "$pkg" "$name"; then
    if engine_flake; then
      echo "fuzz $pkg $name: the engine stopped at the deadline without a finding; running it again"
      tail -n 5 "$log"
      fuzz_once "$pkg" "$name" || { cat "$log"; exit 1; }
    else
      cat "$log"
      exit 1
    fi
  fi
  n=$((n + 1))
done < <(git ls-files -co --exclude-standard '*_test.go' | grep -v '^test/bed/' \
  | xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*' | sed 's/func //' | LC_ALL=C sort)
echo "fuzz: $n targets ran $fuzztime each without a failure"
