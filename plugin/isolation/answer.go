package isolation

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// ErrInvalidAnswer marks an answer that cannot be built: a bad request or a
// tier configured without its paths. It is the plugin's fault, never the
// pod's, so it must not be answered with a container lacking its limit.
var ErrInvalidAnswer = errors.New("cannot build the isolation answer")

// Config is where each tier's files are on the host. The plugin runs in a
// container that sees each of these host paths at the same path (the
// DaemonSet mounts them so), which is what lets it create, probe and hand
// them out under one name.
type Config struct {
	// MPSPipeDir is the MPS control daemon's pipe directory
	// (CUDA_MPS_PIPE_DIRECTORY of the daemon).
	MPSPipeDir string
	// MPSContainerPipeDir is where a container sees it; empty means MPSPipeDir.
	MPSContainerPipeDir string
	// MPSShmDir is the directory that is the MPS server's /dev/shm: clients
	// and server share memory through it, so a client must see it as its own
	// /dev/shm. A directory of its own (on /run, a tmpfs), not the host's
	// /dev/shm, which would expose the node's shared memory to every pod.
	MPSShmDir string

	// HAMiLibrary is the HAMi-core library (libvgpu.so), mounted read-only
	// at gpushare.HAMiContainerLibrary.
	HAMiLibrary string
	// HAMiPreload is a file naming gpushare.HAMiContainerLibrary, mounted
	// read-only over the container's /etc/ld.so.preload.
	HAMiPreload string
	// HAMiLockDir is HAMi-core's lock directory, shared by every container
	// of the node at gpushare.HAMiContainerLockDir.
	HAMiLockDir string
	// HAMiCacheRoot holds the per-answer cache directories the plugin
	// creates (Request.CacheDir is one of them).
	HAMiCacheRoot string
}

// Request is everything an answer depends on.
type Request struct {
	Env   gpushare.ContainerEnv // the container's decision; Env.Isolation selects the tier
	UUIDs []string              // the NVML UUIDs of Env's GPUs, in Env.Set()'s order
	Unit  gpushare.Unit         // the node's memory unit
	// CacheDir is a host directory created for this answer alone (hami-core
	// only): HAMi-core accounts a container's memory in a file there, and
	// must not share it with another container.
	CacheDir string
}

// Answer is what a tier adds to one container's Allocate answer, beside the
// contract's environment (which carries GPUSHARE_ISOLATION itself).
type Answer struct {
	Envs   map[string]string
	Mounts []*pluginapi.Mount
}

// For returns tier r.Env.Isolation's answer for r. No tier (an answer older
// than tiers) and IsolationNone add nothing: GPUSHARE_ISOLATION=none is in
// the contract's environment. It fails, wrapping ErrInvalidAnswer, on a
// request no tier can serve: a compute share on a tier that cannot limit
// compute, no units, a GPU named by anything but its UUID, or a missing path.
func For(cfg Config, r Request) (Answer, error) {
	t := r.Env.Isolation
	if r.Env.ComputePercent < 0 || r.Env.ComputePercent > 100 || (r.Env.ComputePercent > 0 && !t.Limits()) {
		return Answer{}, invalid("compute share %d%% on isolation tier %q", r.Env.ComputePercent, t.OrNone())
	}
	switch t {
	case "", gpushare.IsolationNone:
		return Answer{}, nil
	case gpushare.IsolationMPS:
		return mps(cfg, r)
	case gpushare.IsolationHAMiCore:
		return hamiCore(cfg, r)
	}
	return Answer{}, invalid("unknown isolation tier %q", t)
}

// limitMiB is the container's memory on each of its GPUs in MiB: its units
// per GPU times the unit (a multi-GPU container's units are split evenly).
func limitMiB(r Request) (uint64, error) {
	per := r.Env.UnitsPerGPU()
	if per == 0 || !r.Unit.Valid() || r.Env.ContainerUnits > gpushare.MaxUnits || per*uint64(r.Env.Set().Len()) != r.Env.ContainerUnits {
		return 0, invalid("%d units of %s over GPUs %s", r.Env.ContainerUnits, r.Unit, r.Env.Set())
	}
	// MaxUnits × GiB is 2^30 MiB: no overflow.
	return r.Unit.ToMiB(per), nil
}

// mps pins the client's device memory on each of its GPUs. The node's one
// MPS server serves all its GPUs, and a client sees the server's devices
// renumbered from 0 unless its CUDA_VISIBLE_DEVICES narrows them (MPS
// documentation, CUDA_VISIBLE_DEVICES), so the answer narrows them to the
// container's GPUs by UUID, which needs no knowledge of the server's order;
// the client then sees exactly its GPUs as ordinals 0..k-1, and the limit is
// written by ordinal, the form every NVIDIA example uses (the UUID form is
// not confirmed on hardware: docs/isolation.md). Every GPU of a container
// gets the same limit, so the ordinals' order does not matter.
// The mounts are those NVIDIA's device plugin gives its MPS clients
// (internal/plugin/mps.go): the daemon's pipe directory and its /dev/shm.
func mps(cfg Config, r Request) (Answer, error) {
	mib, err := limitMiB(r)
	if err != nil {
		return Answer{}, err
	}
	gpus := r.Env.Set().Indices()
	if len(r.UUIDs) != len(gpus) {
		return Answer{}, invalid("%d UUIDs for the %d GPUs %s", len(r.UUIDs), len(gpus), r.Env.Set())
	}
	limits := make([]string, len(gpus))
	for k, uuid := range r.UUIDs {
		if !strings.HasPrefix(uuid, "GPU-") || strings.ContainsAny(uuid, "=, ") {
			return Answer{}, invalid("GPU %d has no usable UUID (%q) to show its MPS client", gpus[k], uuid)
		}
		limits[k] = strconv.Itoa(k) + "=" + strconv.FormatUint(mib, 10) + "M"
	}
	pipe := cfg.MPSContainerPipeDir
	if pipe == "" {
		pipe = cfg.MPSPipeDir
	}
	if err := absolute("the MPS pipe directory", cfg.MPSPipeDir, pipe); err != nil {
		return Answer{}, err
	}
	if err := absolute("the MPS shared-memory directory", cfg.MPSShmDir); err != nil {
		return Answer{}, err
	}
	a := Answer{
		Envs: map[string]string{
			gpushare.EnvMPSPipeDirectory:        pipe,
			gpushare.EnvCUDAVisibleDevices:      strings.Join(r.UUIDs, ","),
			gpushare.EnvMPSPinnedDeviceMemLimit: strings.Join(limits, ","),
		},
		Mounts: []*pluginapi.Mount{
			{ContainerPath: pipe, HostPath: cfg.MPSPipeDir},
			{ContainerPath: gpushare.MPSContainerShmDir, HostPath: cfg.MPSShmDir},
		},
	}
	if r.Env.ComputePercent > 0 {
		a.Envs[gpushare.EnvMPSActiveThreadPercentage] = strconv.Itoa(r.Env.ComputePercent)
	}
	return a, nil
}

// hamiCore limits the container through HAMi-core, loaded into every
// process by the preload file. The layout follows HAMi's device plugin
// (pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go): the library
// and the preload file read-only, the lock directory shared, and a cache
// directory of the container's own holding CUDA_DEVICE_MEMORY_SHARED_CACHE.
// HAMi names that directory after the pod; here it is r.CacheDir, fresh per
// answer, so the answer stays the same whichever pod the kubelet serves.
// The unsuffixed CUDA_DEVICE_MEMORY_LIMIT is HAMi-core's limit for every
// device the container sees: one GPU, or a multi-GPU container's GPUs, on
// each of which it holds the same units (the contract splits evenly).
func hamiCore(cfg Config, r Request) (Answer, error) {
	mib, err := limitMiB(r)
	if err != nil {
		return Answer{}, err
	}
	if err := absolute("the HAMi-core paths", cfg.HAMiLibrary, cfg.HAMiPreload, cfg.HAMiLockDir); err != nil {
		return Answer{}, err
	}
	if err := absolute("the container's HAMi-core cache directory", r.CacheDir); err != nil {
		return Answer{}, err
	}
	limit := strconv.FormatUint(mib, 10) + "m"
	a := Answer{
		Envs: map[string]string{
			gpushare.EnvHAMiMemoryLimit:    limit,
			gpushare.EnvHAMiSharedCache:    gpushare.HAMiContainerCacheFile,
			gpushare.EnvHAMiDisableControl: "false",
			gpushare.EnvHAMiCorePolicy:     "default",
		},
		Mounts: []*pluginapi.Mount{
			{ContainerPath: gpushare.HAMiContainerLibrary, HostPath: cfg.HAMiLibrary, ReadOnly: true},
			{ContainerPath: gpushare.HAMiContainerPreload, HostPath: cfg.HAMiPreload, ReadOnly: true},
			{ContainerPath: gpushare.HAMiContainerLockDir, HostPath: cfg.HAMiLockDir},
			{ContainerPath: gpushare.HAMiContainerCacheDir, HostPath: r.CacheDir},
		},
	}
	// A per-device limit overrides the unsuffixed one for that ordinal; the
	// container sees its GPUs as ordinals 0..k-1, each with the same limit.
	for k := range r.Env.Set().Len() {
		a.Envs[gpushare.EnvHAMiMemoryLimit+"_"+strconv.Itoa(k)] = limit
	}
	if r.Env.ComputePercent > 0 {
		a.Envs[gpushare.EnvHAMiSMLimit] = strconv.Itoa(r.Env.ComputePercent)
	}
	return a, nil
}

// absolute checks that every path is set, absolute and clean.
func absolute(what string, paths ...string) error {
	for _, p := range paths {
		if p == "" || !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return invalid("%s: %q is not a clean absolute path", what, p)
		}
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidAnswer, fmt.Sprintf(format, args...))
}
