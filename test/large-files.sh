#!/usr/bin/env bash
# Fails when a tracked file is over 1 MiB and not listed in test/large-files.txt: build outputs and
# other large blobs never belong in git (a 90 MB binary was once committed at the root).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=$((1024 * 1024))
allowed=$(grep -v '^#' test/large-files.txt | sed '/^$/d' || true)
bad=0
while IFS= read -r -d '' f; do
  [ -f "$f" ] || continue
  size=$(stat -c %s "$f")
  if [ "$size" -gt "$limit" ] && ! grep -qxF -- "$f" <<<"$allowed"; then
    echo "tracked file over 1 MiB: $f ($size bytes); build outputs belong in .gitignore, test data in test/large-files.txt" >&2
    bad=1
  fi
done < <(git ls-files -z)
exit $bad
