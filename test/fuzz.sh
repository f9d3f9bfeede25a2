#!/usr/bin/env bash
# Runs every fuzz target of the main module for $FUZZTIME (default 3s) each. The committed seed
# corpora under testdata/fuzz also run as plain tests in `go test ./...`.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime=${FUZZTIME:-3s}
n=0
while IFS=: read -r file name; do
  pkg=./$(dirname "$file")
  echo "fuzz $pkg $name ($fuzztime)"
  go test -run='^$' -fuzz="^${name}\$" -fuzztime="$fuzztime" "$pkg" >/dev/null
  n=$((n + 1))
done < <(git ls-files -co --exclude-standard '*_test.go' | grep -v '^test/bed/' \
  | xargs grep -Ho '^func Fuzz[A-Za-z0-9_]*' | sed 's/func //' | LC_ALL=C sort)
echo "fuzz: $n targets ran $fuzztime each without a failure"
