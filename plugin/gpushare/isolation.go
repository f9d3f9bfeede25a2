package gpushare

import (
	"strconv"
	"strings"
)

// Isolation is a memory-isolation tier (docs/isolation.md): how a container's
// limit is enforced on a GPU, beyond the advisory environment every tier has.
type Isolation string

// The tiers. IsolationAny is a pod's requirement only ("any tier will do"),
// never a GPU's.
const (
	IsolationNone     Isolation = "none"      // advisory environment only, as the seed
	IsolationMPS      Isolation = "mps"       // NVIDIA MPS with a per-client pinned memory limit
	IsolationHAMiCore Isolation = "hami-core" // the HAMi-core CUDA interception library
	IsolationAny      Isolation = "any"
)

// Isolation contract names (contract section 9).
const (
	// AnnotationIsolation on a pod names the tier its GPUs must offer
	// (none, mps, hami-core or any; absent means any).
	AnnotationIsolation = "gpushare.io/isolation"
	// AnnotationComputePercent on a pod is the share of a GPU's compute its
	// containers may use, 1–100: a limit, not a reservation. Refused on
	// IsolationNone, which cannot enforce it.
	AnnotationComputePercent = "gpushare.io/compute-percent"
	// LabelIsolation on a node overrides the plugin's -isolation flag.
	LabelIsolation = "gpushare.io/isolation"
	// EnvIsolation is the tier a container's answer enforces.
	EnvIsolation = "GPUSHARE_ISOLATION"
	// EnvComputePercent is the container's compute limit, when it has one.
	EnvComputePercent = "GPUSHARE_COMPUTE_PERCENT"

	// NVIDIA MPS client variables (MPS documentation, appendix "Environment variables").
	EnvMPSPipeDirectory          = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSPinnedDeviceMemLimit   = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvMPSActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	// EnvCUDAVisibleDevices names, by UUID, the GPUs an mps client may use
	// among those of the MPS server, which serves every GPU of the node.
	EnvCUDAVisibleDevices = "CUDA_VISIBLE_DEVICES"

	// HAMi-core variables.
	EnvHAMiMemoryLimit = "CUDA_DEVICE_MEMORY_LIMIT"
	EnvHAMiSMLimit     = "CUDA_DEVICE_SM_LIMIT"
	EnvHAMiSharedCache = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
	// EnvHAMiDisableControl "true" turns HAMi-core off in the container, and
	// EnvHAMiCorePolicy "disable" ignores its SM limit: the answer sets both
	// to their defaults so that, where the runtime applies the answer last
	// (the CDI strategies), a pod's own value cannot lift its limits.
	EnvHAMiDisableControl = "CUDA_DISABLE_CONTROL"
	EnvHAMiCorePolicy     = "GPU_CORE_UTILIZATION_POLICY"
)

// Paths inside a container that the tiers' answers mount (contract section
// 9). The host side of each mount is the plugin's configuration.
const (
	// MPSContainerShmDir is where an MPS client gets the directory the MPS
	// server shares memory through: it must see the server's /dev/shm.
	MPSContainerShmDir = "/dev/shm"
	// HAMiContainerLibrary is where the HAMi-core library is mounted; the
	// host's preload file must name exactly this path.
	HAMiContainerLibrary = "/usr/local/vgpu/libvgpu.so"
	// HAMiContainerPreload is the dynamic loader's preload list, replaced by
	// the host's preload file so every process of the container loads the
	// library without the image's cooperation.
	HAMiContainerPreload = "/etc/ld.so.preload"
	// HAMiContainerLockDir is the lock directory HAMi-core uses across the
	// processes of a node (its /tmp/vgpulock).
	HAMiContainerLockDir = "/tmp/vgpulock"
	// HAMiContainerCacheDir is where a container's own cache directory is
	// mounted; HAMi-core keeps the container's usage in EnvHAMiSharedCache,
	// HAMiContainerCacheFile inside it.
	HAMiContainerCacheDir  = "/usr/local/vgpu/gpushare"
	HAMiContainerCacheFile = HAMiContainerCacheDir + "/cudevshr.cache"
)

// ErrInvalidIsolation marks an unknown tier or compute share.
const ErrInvalidIsolation Error = "invalid gpushare isolation"

// IsolationError says which value is wrong and why.
type IsolationError struct {
	Field, Value, Reason string
}

func (e *IsolationError) Error() string {
	return string(ErrInvalidIsolation) + ": " + e.Field + " " + clip(e.Value) + " " + e.Reason
}

// Unwrap returns ErrInvalidIsolation.
func (e *IsolationError) Unwrap() error { return ErrInvalidIsolation }

// ParseIsolation reads a GPU's or a node's tier: none, mps or hami-core.
func ParseIsolation(s string) (Isolation, error) {
	switch t := Isolation(strings.TrimSpace(s)); t {
	case IsolationNone, IsolationMPS, IsolationHAMiCore:
		return t, nil
	}
	return "", &IsolationError{Field: "tier", Value: s, Reason: "is not one of none, mps, hami-core"}
}

// PodIsolation reads a pod's required tier from its annotations: any when
// absent.
func PodIsolation(annotations map[string]string) (Isolation, error) {
	v, ok := annotations[AnnotationIsolation]
	if !ok || Isolation(v) == IsolationAny {
		return IsolationAny, nil
	}
	t, err := ParseIsolation(v)
	if err != nil {
		return "", &IsolationError{Field: AnnotationIsolation, Value: v, Reason: "is not one of none, mps, hami-core, any"}
	}
	return t, nil
}

// PodComputePercent reads a pod's compute share from its annotations: 0 when
// absent, else 1–100.
func PodComputePercent(annotations map[string]string) (int, error) {
	v, ok := annotations[AnnotationComputePercent]
	if !ok {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 100 || strconv.Itoa(n) != v {
		return 0, &IsolationError{Field: AnnotationComputePercent, Value: v, Reason: "is not a whole number from 1 to 100"}
	}
	return n, nil
}

// PodIsolationRequest reads what a pod's isolation annotations ask: the
// required tier (any when absent) and the compute share (0 when absent). A
// share with the tier none, which cannot enforce it, is an *IsolationError
// too, so the extender and the plugin refuse such a pod in the same words.
func PodIsolationRequest(annotations map[string]string) (Isolation, int, error) {
	want, err := PodIsolation(annotations)
	if err != nil {
		return "", 0, err
	}
	percent, err := PodComputePercent(annotations)
	if err != nil {
		return "", 0, err
	}
	if percent > 0 && want == IsolationNone {
		return "", 0, &IsolationError{Field: AnnotationComputePercent, Value: annotations[AnnotationComputePercent],
			Reason: "cannot be enforced with " + AnnotationIsolation + ` "none": ask for mps, hami-core or any`}
	}
	return want, percent, nil
}

// Offers reports whether a GPU of tier t satisfies a pod requiring want.
// A GPU with no tier published (an older plugin) offers none.
func (t Isolation) Offers(want Isolation) bool {
	if t == "" {
		t = IsolationNone
	}
	return want == IsolationAny || want == t
}

// Limits reports whether tier t can enforce a compute share.
func (t Isolation) Limits() bool { return t == IsolationMPS || t == IsolationHAMiCore }

// OrNone returns t, or IsolationNone for the empty tier of a GPU published
// by a plugin older than tiers (what such a GPU offers, and what a reader
// should expect in its containers' environment: nothing).
func (t Isolation) OrNone() Isolation {
	if t == "" {
		return IsolationNone
	}
	return t
}

// parseTier reads a GPU's tier exactly as written (no spaces): what an
// answer or a record carries. It returns why on failure.
func parseTier(s string) (Isolation, string) {
	switch t := Isolation(s); t {
	case IsolationNone, IsolationMPS, IsolationHAMiCore:
		return t, ""
	}
	return "", "is not one of none, mps, hami-core"
}

// parsePercent reads a compute share: a canonical decimal from 1 to 100.
func parsePercent(s string) (int, string) {
	n, reason := parseDigits(s, 100)
	if reason != "" || n == 0 || uintString(n) != s {
		return 0, "is not a whole number from 1 to 100"
	}
	return int(n), ""
}

// tierPercentReason says why compute share n cannot go with tier t, or "".
// Zero is no share; a share needs a tier that enforces it.
func tierPercentReason(t Isolation, n int) string {
	switch {
	case n < 0 || n > 100:
		return "is outside [0, 100]"
	case n > 0 && !t.Limits():
		return "needs an isolation tier that limits compute (mps or hami-core), not " + strconv.Quote(string(t.OrNone()))
	}
	return ""
}
