#!/usr/bin/env bash
# Builds the test bed's binaries (etcd, kube-apiserver, kube-scheduler, kube-controller-manager,
# hollow-kubelet, fake-cri) from the Go module proxy, pinned by this module's go.mod, into a cache
# outside the repository:
#
#   $GPUSHARE_BED_CACHE/<k8s version>-<hash of go.mod, go.sum, sources, Go version>/
#
# (GPUSHARE_BED_CACHE defaults to ${XDG_CACHE_HOME:-$HOME/.cache}/gpushare-bed). A directory that is
# already complete is reused without compiling anything, so a second run or a fresh clone on the same
# machine costs milliseconds. One build runs at a time per cache (a lock): a second caller waits
# for it, then finds the binaries complete. The last line printed is the binaries' directory.
#
# Env: GPUSHARE_BED_CACHE (see above); BED_COMPONENTS (default: all six).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
export GOWORK=off GOFLAGS=-mod=readonly GOTOOLCHAIN=local
cache=${GPUSHARE_BED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpushare-bed}
components=${BED_COMPONENTS:-"etcd kube-apiserver kube-scheduler kube-controller-manager hollow-kubelet fake-cri"}
k8s=$(awk '($1=="require" && $2=="k8s.io/kubernetes") {print $3; exit} ($1=="k8s.io/kubernetes" && $2 ~ /^v/) {print $2; exit}' go.mod)
[ -n "$k8s" ] || { echo "build.sh: go.mod does not require k8s.io/kubernetes" >&2; exit 1; }
hash=$( { go env GOVERSION; cat build.sh go.mod go.sum; find cmd -name '*.go' | LC_ALL=C sort | xargs cat; } \
  | sha256sum | cut -c1-16)
out=$cache/$k8s-$hash
complete() { for c in $components; do [ -x "$out/$c" ] || return 1; done; }
if complete; then echo "$out"; exit 0; fi
# make check's background build, CI's early one and test processes calling Binaries() can start
# together; two go builds of one component would write the same temporary file.
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
if command -v flock >/dev/null; then
  flock -n 9 || { echo "waiting for another build of the test bed in $cache" >&2; flock 9; }
fi
if complete; then echo "$out"; exit 0; fi

# A private build cache: another job cleaning the shared one mid-build breaks a 4-minute link.
export GOCACHE=$cache/gocache
mkdir -p "$out"
# Stamp the real version, or servers report v0.0.0-master and nodes show it as their kubelet version.
major=${k8s#v}; major=${major%%.*}; minor=${k8s#v*.}; minor=${minor%%.*}
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$k8s -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
pkg() {
  case $1 in
    etcd|hollow-kubelet|fake-cri) echo "./cmd/$1" ;;
    *) echo "k8s.io/kubernetes/cmd/$1" ;;
  esac
}
# A cold build compiles for minutes without a word: say which component is building, and every 30 s
# how long it has taken so far, on stderr (stdout's last line is the result). The ticker's sleep gets
# no inherited output, so killing the ticker closes every pipe a caller may be reading to its end.
ticker=
tick() {
  local since=$1
  while sleep 30 </dev/null >/dev/null 2>&1; do
    echo "  still building $c: $(( $(date +%s) - since ))s" >&2
  done
}
stop_ticker() {
  [ -z "$ticker" ] || kill "$ticker" 2>/dev/null || true
  [ -z "$ticker" ] || wait "$ticker" 2>/dev/null || true
  ticker=
}
trap stop_ticker EXIT
n=0 total=$(wc -w <<<"$components")
for c in $components; do
  n=$((n + 1))
  [ -x "$out/$c" ] && continue
  start=$(date +%s)
  echo "building $c ($n of $total) into $out" >&2
  tick "$start" >&2 </dev/null &
  ticker=$!
  # Build to a temporary name and rename, so an interrupted build never leaves a half binary.
  go build -trimpath -ldflags="$ldflags" -o "$out/.$c.tmp" "$(pkg "$c")"
  stop_ticker
  mv "$out/.$c.tmp" "$out/$c"
  echo "built $c in $(( $(date +%s) - start ))s" >&2
done
# Keep the three newest builds (other checkouts may use other hashes); older ones are dead weight.
ls -dt "$cache"/v*-*/ 2>/dev/null | tail -n +4 | xargs -r rm -rf
echo "$out"
