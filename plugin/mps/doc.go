// Package mps runs the node's NVIDIA MPS control daemon for the "mps"
// isolation tier: one daemon for all the tier's GPUs, those GPUs in
// EXCLUSIVE_PROCESS compute mode while it runs, and the previous modes back
// when it stops. Containers then get CUDA_MPS_PIPE_DIRECTORY (PipeDir) and a
// per-container CUDA_MPS_PINNED_DEVICE_MEM_LIMIT from the device plugin; the
// daemon itself sets no default limit, so each container's limit is the one
// its Allocate answer wrote.
//
// One daemon, not one per GPU: its CUDA_VISIBLE_DEVICES lists every tier GPU
// by UUID, so a container given two GPUs reaches both through one server.
// UUIDs, because MPS renumbers the devices it exposes.
//
// The daemon runs in the foreground ("nvidia-cuda-mps-control -f") as a child
// of this process rather than forked away with -d, so that its exit is seen
// at once (Healthy says how it exited), nothing is left as a zombie when the
// plugin is PID 1 of its container, and Stop can end it with a signal when it
// ignores "quit". Its output goes to gpushare-control-daemon.out in LogDir
// (a file, not a pipe: MPS servers inherit the daemon's output, and a pipe
// would either keep Wait from returning or end them with SIGPIPE).
//
// Compute modes: Start records each GPU's mode before changing it, in
// LogDir/gpushare-compute-modes.json with the boot ID, so a plugin that
// crashed after switching the GPUs restores the operator's modes on its next
// Stop rather than the EXCLUSIVE_PROCESS it finds. A record from an earlier
// boot is ignored: NVIDIA resets the mode to DEFAULT at boot. A GPU left in
// EXCLUSIVE_PROCESS without a daemon admits one CUDA process at a time (the
// "all CUDA-capable devices are busy" failure), so a Start that fails puts
// the modes back before returning.
//
// UIDs: the control daemon starts each MPS server with the UID of the first
// client that asks, and a client of another UID waits until every client of
// the running server has exited (nvidia-cuda-mps-control(1)): on a shared node
// that is a pod hanging for as long as another pod runs. So the supported
// setup is one UID for every MPS client of the node, the daemon's: root by
// default (the plugin's DaemonSet runs as root), or Config.RunAs, which runs
// the daemon as that user and gives it the directories (mode 0755). A client
// of another UID either waits behind the running server or fails, because a
// server started for it cannot write to those directories; this package
// cannot see either. The device plugin cannot choose a container's UID;
// admission policy (runAsUser) must.
//
// Lifetime: the daemon is this process's child, so it ends with the plugin's
// container (the container's processes are killed with it), and every MPS
// client on the node then loses its server. Stop on the way out at least
// puts the compute modes back; a plugin killed outright leaves the record,
// which its successor's Start or Stop honours.
//
// Directories: PipeDir and LogDir are created 0755 (owned by RunAs when
// set); with SELinux enabled PipeDir gets the container_file_t type, as
// NVIDIA's device plugin gives its pipe directory.
//
// Health: the daemon answers "get_server_list" through the control binary
// within Config.HealthTimeout, and every tier GPU is still in
// EXCLUSIVE_PROCESS (a GPU switched back by hand would let a process that
// bypasses MPS take it without a limit).
//
// The package holds no package-level mutable state.
package mps
