#!/usr/bin/env bash
# gpushare's real-GPU check of the MPS isolation tier (issue 14) and of the DRA driver in it. From
# the repository root:
#
#   bash test/gpu/run.sh             the check; needs root, the NVIDIA driver, Go with cgo (or
#                                    GPU_BIN, below) and nvcc or PyTorch
#   bash test/gpu/run.sh build DIR   only build the Go programs into DIR, for a GPU machine
#                                    without Go or a network: carry DIR there, run with GPU_BIN=DIR
#   bash test/gpu/run.sh dry-run     everything but the GPU (simulated NVML, the fake MPS daemon, a
#                                    fake client): checks this script anywhere, proves nothing about MPS
#
# The check: (a) the real-NVML tests; (b) plugin/mps starts the MPS control daemon on GPU
# $GPU_INDEX (default 0) with the real NVML backend; (c) two CUDA clients get exactly the
# environment Allocate gives an mps container (CUDA_MPS_PIPE_DIRECTORY, CUDA_VISIBLE_DEVICES=<GPU
# UUID> and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M, then =40960M) and each allocates 30 GiB: the
# first must fail with out-of-memory, the second succeed; a third run tries the UUID form; (d)
# everything seen is printed, and to $OUT/gpu-run.txt when OUT is set; (e) DRA mode (dracheck):
# the daemon started again, plugin/dra's driver in the mps tier, on a fake API server holding the
# node, publishes the GPU's device in its ResourceSlice and prepares claims of 20 and 40 GiB
# allocated on it over dra.sock (the kubelet's dra/v1 API); the client runs with each claim's CDI
# environment (under 20 GiB it must fail with out-of-memory, under 40 GiB succeed); both are
# unprepared and their specifications gone; then a hami-core configuration (placeholder library,
# no client) shows CUDA_DEVICE_MEMORY_LIMIT in a prepared specification. Where no NVIDIA driver
# works it prints "skipped: no NVIDIA driver ..." and exits 0. Every step has a timeout within an
# overall 7.5-minute budget, and an EXIT trap stops the daemons and puts the compute mode back
# even if the Go programs could not.
# Exit status: 0 PASS (or skipped), 1 FAIL or incomplete.
set -uo pipefail

readonly BUDGET_S=450 # all steps; the trap and the summary fit in the rest of 8 minutes
readonly GPU_INDEX=${GPU_INDEX:-0}
DEADLINE=$((SECONDS + BUDGET_S))

# step_timeout prints the seconds a step may take: its own cap, or what is left of the budget.
step_timeout() {
	local left=$((DEADLINE - SECONDS))
	((left < 1)) && left=1
	echo $((left < $1 ? left : $1))
}

say() { printf '%s\n' "$*"; }
section() { printf '\n## %s\n\n' "$*"; }

main() {
	case "${1:-}" in
	build) build_only "${2:?usage: run.sh build DIR}" ;;
	dry-run) check dry-run ;;
	"") check real ;;
	*) say "usage: bash test/gpu/run.sh [build DIR | dry-run]" && return 2 ;;
	esac
}

# build_only compiles the real-NVML test binary, mpscheck and dracheck into $1.
build_only() {
	mkdir -p "$1" || return 1
	CGO_ENABLED=1 go test -c -o "$1/nvml.test" ./plugin/nvml/ &&
		CGO_ENABLED=1 go build -o "$1/mpscheck" ./test/gpu/mpscheck &&
		CGO_ENABLED=1 go build -o "$1/dracheck" ./test/gpu/dracheck &&
		say "built $1/nvml.test, $1/mpscheck and $1/dracheck; on the GPU machine: GPU_BIN=$1 bash test/gpu/run.sh"
}

# check runs the whole check; $1 is real or dry-run.
check() {
	local mode=$1
	header "$mode"
	if [[ $mode == real ]]; then
		driver_present || return 0
		if [[ $(id -u) != 0 ]]; then
			say "FAIL: run as root: MPS needs the GPU's compute mode changed, which NVML allows only root"
			return 1
		fi
	fi
	if [[ -n ${GPU_BIN:-} ]]; then
		GPU_BIN=$(cd "$GPU_BIN" && pwd) || return 1
		say "prebuilt Go programs: $GPU_BIN"
	fi
	WORK=$(mktemp -d /tmp/gpushare-gpu.XXXXXX) || return 1
	trap cleanup EXIT
	trap 'exit 130' INT
	trap 'exit 143' TERM
	[[ $mode == real ]] && remember_mode

	local nvml_rc mps_rc dra_rc client
	nvml_tests "$mode"
	nvml_rc=$?
	client=$(build_client "$mode")
	mps_check "$mode" "$client"
	mps_rc=$?
	dra_check "$mode" "$client"
	dra_rc=$?
	summary "$nvml_rc" "$mps_rc" "$dra_rc" "$client"
}

# header prints what ran where.
header() {
	say "# gpushare real-GPU check ($1)"
	say
	say "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	say "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (uncommitted changes)')"
	say "host:   $(uname -srm)"
	say "go:     $(go version 2>/dev/null || echo 'not found')"
	[[ $1 == dry-run ]] && say "DRY RUN: simulated NVML, fake MPS control daemon, fake client; proves nothing about a GPU"
}

# driver_present prints the GPUs, or the skip line when no driver works.
driver_present() {
	if ! command -v nvidia-smi >/dev/null 2>&1; then
		say "skipped: no NVIDIA driver (nvidia-smi not found)"
		return 1
	fi
	local smi
	if ! smi=$(timeout 60 nvidia-smi 2>&1); then
		say "skipped: no NVIDIA driver (nvidia-smi failed: $(head -n 3 <<<"$smi" | tr '\n' ' '))"
		return 1
	fi
	section "nvidia-smi"
	say "$smi"
	say
	nvidia-smi --query-gpu=index,name,uuid,memory.total,compute_mode,persistence_mode,driver_version --format=csv
	return 0
}

# remember_mode records GPU_INDEX's UUID and compute mode for the trap.
remember_mode() {
	local line
	line=$(nvidia-smi -i "$GPU_INDEX" --query-gpu=uuid,compute_mode --format=csv,noheader) || return
	GPU_UUID=${line%%,*}
	BEFORE_MODE=$(tr -d ' ' <<<"${line#*,}")
	BEFORE_MODE=${BEFORE_MODE^^}
	say "GPU $GPU_INDEX: $GPU_UUID, compute mode $BEFORE_MODE before the check"
}

# cleanup is the EXIT trap: whatever happened, no daemon of ours is left and the compute mode is
# back. The Go program normally did both already; then this does nothing.
cleanup() {
	local control pipe
	control=$(control_bin)
	for pipe in "$WORK/pipe" "$WORK/dra/pipe"; do # mpscheck's daemon, dracheck's
		if [[ -S $pipe/control ]] && [[ -n $control ]]; then
			say "trap: an MPS control daemon may still run in $pipe; sending quit"
			echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe timeout 20 "$control" || true
		fi
	done
	if [[ -n ${BEFORE_MODE:-} ]]; then
		local now
		now=$(nvidia-smi -i "$GPU_UUID" --query-gpu=compute_mode --format=csv,noheader 2>/dev/null | tr -d ' ')
		if [[ ${now^^} != "$BEFORE_MODE" ]]; then
			say "trap: compute mode is ${now:-unknown}; restoring $BEFORE_MODE"
			nvidia-smi -i "$GPU_UUID" -c "$BEFORE_MODE" || say "trap: FAILED to restore the compute mode"
		fi
	fi
	rm -rf "$WORK"
}

# control_bin names the control program the check uses.
control_bin() {
	if [[ -x ${WORK:-}/fake-mps-control ]]; then
		echo "$WORK/fake-mps-control"
	else
		command -v nvidia-cuda-mps-control || true
	fi
}

# nvml_tests runs the real-NVML tests. TestRealNVML skips itself without libnvidia-ml.so.1, which
# counts as a failure in a real run: the driver is there, so the library must load.
nvml_tests() {
	local mode=$1 out rc
	section "(a) real-NVML tests: TestRealNVML in plugin/nvml"
	out=$WORK/nvml-test.txt
	if [[ -n ${GPU_BIN:-} ]]; then
		(cd plugin/nvml && timeout -k 10 "$(step_timeout 120)" "$GPU_BIN/nvml.test" -test.run 'TestRealNVML' -test.v -test.count=1)
	else
		CGO_ENABLED=1 timeout -k 10 "$(step_timeout 240)" go test -count=1 -run 'TestRealNVML' -v ./plugin/nvml/
	fi 2>&1 | tee "$out"
	rc=${PIPESTATUS[0]}
	if ((rc == 0)) && [[ $mode == real ]] && grep -q -- '--- SKIP: TestRealNVML' "$out"; then
		say "TestRealNVML skipped although nvidia-smi works: libnvidia-ml.so.1 did not load"
		rc=1
	fi
	say "exit $rc"
	return $rc
}

# build_client prints the client command (empty when none could be built); its progress goes to
# stderr, which main's caller merges into the output.
build_client() {
	if [[ $1 == dry-run ]]; then
		echo "$PWD/test/gpu/fakeclient.sh"
		return
	fi
	section "(c) CUDA client" >&2
	local nvcc
	nvcc=$(command -v nvcc || { [[ -x /usr/local/cuda/bin/nvcc ]] && echo /usr/local/cuda/bin/nvcc; })
	if [[ -n $nvcc ]]; then
		say "$("$nvcc" --version | tail -n 2 | tr '\n' ' ')" >&2
		if timeout -k 10 "$(step_timeout 150)" "$nvcc" -O2 -o "$WORK/alloc" test/gpu/alloc.cu >&2; then
			say "client: test/gpu/alloc.cu built with $nvcc" >&2
			echo "$WORK/alloc"
			return
		fi
		say "nvcc failed to build test/gpu/alloc.cu" >&2
	else
		say "nvcc not found (PATH, /usr/local/cuda/bin)" >&2
	fi
	local torch
	if torch=$(timeout "$(step_timeout 60)" python3 -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>&1); then
		say "client: test/gpu/alloc.py with PyTorch $torch" >&2
		echo "python3 $PWD/test/gpu/alloc.py"
		return
	fi
	say "no CUDA client: PyTorch not usable either ($(tail -n 1 <<<"$torch"))" >&2
}

# go_program prints the path of the Go program ./test/gpu/$1: GPU_BIN's, or built into WORK.
go_program() {
	local bin
	if [[ -n ${GPU_BIN:-} ]]; then
		bin=$GPU_BIN/$1
		[[ -x $bin ]] || { say "FAIL: $bin missing: build it with bash test/gpu/run.sh build DIR" >&2 && return 1; }
	else
		bin=$WORK/$1
		CGO_ENABLED=1 timeout -k 10 "$(step_timeout 180)" go build -o "$bin" "./test/gpu/$1" || {
			say "FAIL: go build ./test/gpu/$1" >&2
			return 1
		}
	fi
	echo "$bin"
}

# dry_run_args sets DRY_RUN_ARGS, the programs' extra arguments: in a dry run the simulated
# backend and the fake MPS daemon (built once), none in a real run.
dry_run_args() {
	DRY_RUN_ARGS=()
	[[ $1 == dry-run ]] || return 0
	if [[ ! -x $WORK/fake-mps-control ]]; then
		go build -o "$WORK/fake-mps-control" ./test/fakemps/cmd/fake-mps-control || return 1
	fi
	DRY_RUN_ARGS=(-backend simulated:dgxh200 -control "$WORK/fake-mps-control")
}

# mps_check builds (or takes from GPU_BIN) mpscheck and runs it: (b), (c) and (d).
mps_check() {
	local mode=$1 client=$2 bin
	section "(b) plugin/mps on the GPU, (c) the two clients"
	bin=$(go_program mpscheck) && dry_run_args "$mode" || return 1
	[[ -z $client ]] && say "no CUDA client could be built; the daemon is still started, checked and stopped"
	timeout -k 30 "$(step_timeout 240)" "$bin" "${DRY_RUN_ARGS[@]}" -work "$WORK" -gpu "$GPU_INDEX" \
		-client "$client" -client-timeout 90s
}

# dra_check builds (or takes from GPU_BIN) dracheck and runs it: (e), in $WORK/dra (its daemon's
# pipe directory $WORK/dra/pipe, which the trap knows).
dra_check() {
	local mode=$1 client=$2 bin
	section "(e) DRA mode: slices and two claims under MPS"
	bin=$(go_program dracheck) && dry_run_args "$mode" && mkdir -p "$WORK/dra" || return 1
	[[ -z $client ]] && say "no CUDA client could be built; the slice and the claims' specifications are still checked"
	timeout -k 30 "$(step_timeout 180)" "$bin" "${DRY_RUN_ARGS[@]}" -work "$WORK/dra" -gpu "$GPU_INDEX" \
		-client "$client" -client-timeout 60s -driver-timeout 30s
}

# verdict prints PASS for exit status 0, else FAIL with it.
verdict() { (($1 == 0)) && echo PASS || echo "FAIL (exit $1)"; }

# summary prints the overall verdict and sets the exit status.
summary() {
	local nvml_rc=$1 mps_rc=$2 dra_rc=$3 client=$4
	section "Summary"
	say "real-NVML tests: $(verdict "$nvml_rc")"
	say "MPS check:       $(verdict "$mps_rc")"
	say "DRA check:       $(verdict "$dra_rc")"
	[[ -z $client ]] && say "CUDA client:     none could be built: INCOMPLETE"
	say "took ${SECONDS}s"
	if ((nvml_rc == 0 && mps_rc == 0 && dra_rc == 0)) && [[ -n $client ]]; then
		say "RESULT: PASS"
		return 0
	fi
	say "RESULT: FAIL"
	return 1
}

cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
if [[ -n ${OUT:-} ]]; then
	main "$@" 2>&1 | tee "$OUT/gpu-run.txt"
	exit "${PIPESTATUS[0]}"
fi
main "$@"
