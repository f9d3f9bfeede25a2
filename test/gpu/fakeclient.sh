#!/usr/bin/env bash
# fakeclient.sh: the CUDA client of run.sh's dry run (no GPU). It applies
# CUDA_MPS_PINNED_DEVICE_MEM_LIMIT as MPS would, so the script's logic is
# exercised: exit 0 when "<device>=<N>M" allows the allocation, 2 when it
# does not, 1 when the variables Allocate sets are missing.
set -u
gib=${1:-30}
pipe=${CUDA_MPS_PIPE_DIRECTORY:-}
limit=${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-}
if [[ -z $pipe || ! -S $pipe/control ]]; then
	echo "RESULT error: no MPS control socket in CUDA_MPS_PIPE_DIRECTORY=$pipe"
	exit 1
fi
mib=${limit##*=}
mib=${mib%M}
if [[ ! $mib =~ ^[0-9]+$ ]]; then
	echo "RESULT error: cannot read CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=$limit"
	exit 1
fi
if ((mib < gib * 1024)); then
	echo "RESULT oom: ${gib} GiB exceeds the ${mib} MiB limit (simulated)"
	exit 2
fi
echo "RESULT ok: ${gib} GiB within the ${mib} MiB limit (simulated)"
