package gpushare

import (
	"strconv"
	"strings"
)

// ContainerEnv is the environment our device plugin returns from Allocate for
// one container (contract section 3).
type ContainerEnv struct {
	GPUIndex int // EnvGPUIndex and EnvVisibleDevices; the first of GPUs when set
	// GPUs are the container's GPUs when it has more than one (issue 15),
	// 0 otherwise; ContainerUnits are split evenly over them.
	GPUs             GPUSet
	PodUnits         uint64 // EnvPodUnits
	ContainerUnits   uint64 // EnvContainerUnits
	DevUnits         uint64 // EnvDevUnits
	DisableIsolation bool   // EnvDisableIsolation="true" when set, absent otherwise
	// Isolation is the tier the answer enforces (EnvIsolation); empty in
	// records and checkpoints older than tiers.
	Isolation Isolation
	// ComputePercent is the container's compute limit (EnvComputePercent),
	// 0 for none; only on tiers that can enforce it.
	ComputePercent int
}

// Map returns the environment variables of e. NVIDIA_VISIBLE_DEVICES carries
// the index, not the UUID: the index is what the annotations name, so the
// runtime exposes exactly the GPU the scheduler charged. A container on
// several GPUs gets them all, "0,1", in NVIDIA_VISIBLE_DEVICES and
// ALIYUN_COM_GPU_MEM_IDX (ACK's form), and their number in GPUSHARE_GPU_COUNT.
func (e ContainerEnv) Map() map[string]string {
	idx := strconv.Itoa(e.GPUIndex)
	if e.GPUs.Len() > 1 {
		idx = e.GPUs.String()
	}
	m := map[string]string{
		EnvVisibleDevices: idx,
		EnvGPUIndex:       idx,
		EnvPodUnits:       uintString(e.PodUnits),
		EnvContainerUnits: uintString(e.ContainerUnits),
		EnvDevUnits:       uintString(e.DevUnits),
	}
	if e.GPUs.Len() > 1 {
		m[EnvGPUCount] = strconv.Itoa(e.GPUs.Len())
	}
	if e.DisableIsolation {
		m[EnvDisableIsolation] = LabelValueTrue
	}
	if e.Isolation != "" {
		m[EnvIsolation] = string(e.Isolation)
	}
	if e.ComputePercent > 0 {
		m[EnvComputePercent] = strconv.Itoa(e.ComputePercent)
	}
	return m
}

// ParseContainerEnv reads a container's gpushare environment, e.g. from the
// kubelet's checkpoint; other variables in env are ignored. The four
// ALIYUN_COM_GPU_MEM_* variables and NVIDIA_VISIBLE_DEVICES are required, and
// NVIDIA_VISIBLE_DEVICES must name the same GPU index (or, for a container
// on several GPUs, the same ascending list, with GPUSHARE_GPU_COUNT, when
// present, their number). A GPU UUID there (the
// old plugin's form before 2022) is accepted as it cannot be checked, and so
// are DeviceListMountDir and VisibleDevicesVoid, which the volume-mounts and
// CDI device-list strategies write: the GPU is then named by a mount or a CDI
// device, not by the environment. Any other text, such as the old failure
// marker "no-gpu-has-...-to-run", is an *EnvError (ErrInvalidEnv).
// GPUSHARE_ISOLATION and GPUSHARE_COMPUTE_PERCENT are optional (answers
// older than tiers lack them); when present they must be exactly what Map
// writes: a GPU's tier, and 1–100 on a tier that can limit compute.
func ParseContainerEnv(env map[string]string) (ContainerEnv, error) {
	var e ContainerEnv
	get := func(key string) (string, error) {
		v, ok := env[key]
		if !ok {
			return "", &EnvError{Key: key, Reason: "is missing"}
		}
		return v, nil
	}
	raw, err := get(EnvGPUIndex)
	if err != nil {
		return ContainerEnv{}, err
	}
	set, reason := parseGPUList(raw)
	if reason != "" {
		return ContainerEnv{}, &EnvError{Key: EnvGPUIndex, Value: raw, Reason: reason}
	}
	e.GPUIndex = set.First()
	if set.Len() > 1 {
		e.GPUs = set
	}
	if err := checkGPUCount(env, set); err != nil {
		return ContainerEnv{}, err
	}
	for _, f := range []struct {
		key string
		dst *uint64
	}{{EnvPodUnits, &e.PodUnits}, {EnvContainerUnits, &e.ContainerUnits}, {EnvDevUnits, &e.DevUnits}} {
		raw, err := get(f.key)
		if err != nil {
			return ContainerEnv{}, err
		}
		v, reason := parseUnits(raw)
		if reason != "" {
			return ContainerEnv{}, &EnvError{Key: f.key, Value: raw, Reason: reason}
		}
		*f.dst = v
	}
	vis, err := get(EnvVisibleDevices)
	if err != nil {
		return ContainerEnv{}, err
	}
	if !strings.HasPrefix(vis, "GPU-") && vis != DeviceListMountDir && vis != VisibleDevicesVoid {
		if v, reason := parseGPUList(vis); reason != "" || v != set {
			return ContainerEnv{}, &EnvError{Key: EnvVisibleDevices, Value: vis, Reason: "does not name GPU index " + raw}
		}
	}
	switch v, ok := env[EnvDisableIsolation]; {
	case !ok || v == "false":
	case v == LabelValueTrue:
		e.DisableIsolation = true
	default:
		return ContainerEnv{}, &EnvError{Key: EnvDisableIsolation, Value: v, Reason: `is neither "true" nor "false"`}
	}
	if err := parseTierEnv(env, &e); err != nil {
		return ContainerEnv{}, err
	}
	if e.ContainerUnits%uint64(set.Len()) != 0 {
		return ContainerEnv{}, &EnvError{Key: EnvContainerUnits, Value: uintString(e.ContainerUnits), Reason: "does not divide evenly over GPUs " + raw}
	}
	return e, nil
}

// checkGPUCount checks GPUSHARE_GPU_COUNT, when present, against the GPUs
// the index variable lists; absent, a list of several GPUs is enough.
func checkGPUCount(env map[string]string, set GPUSet) error {
	v, ok := env[EnvGPUCount]
	if !ok {
		return nil
	}
	if n, reason := parseDigits(v, MaxGPUsPerNode); reason != "" || int(n) != set.Len() || strconv.Itoa(int(n)) != v {
		return &EnvError{Key: EnvGPUCount, Value: v, Reason: "is not the number of GPUs in " + EnvGPUIndex + " (" + strconv.Itoa(set.Len()) + ")"}
	}
	return nil
}

// parseTierEnv reads the tier and the compute share into e.
func parseTierEnv(env map[string]string, e *ContainerEnv) error {
	if v, ok := env[EnvIsolation]; ok {
		t, reason := parseTier(v)
		if reason != "" {
			return &EnvError{Key: EnvIsolation, Value: v, Reason: reason}
		}
		e.Isolation = t
	}
	if v, ok := env[EnvComputePercent]; ok {
		n, reason := parsePercent(v)
		if reason == "" {
			reason = tierPercentReason(e.Isolation, n)
		}
		if reason != "" {
			return &EnvError{Key: EnvComputePercent, Value: v, Reason: reason}
		}
		e.ComputePercent = n
	}
	return nil
}

// Set returns the container's GPUs: GPUs, or the one GPUIndex.
func (e ContainerEnv) Set() GPUSet {
	if e.GPUs.Len() > 1 {
		return e.GPUs
	}
	return NewGPUSet(e.GPUIndex)
}

// UnitsPerGPU is the container's units on each of its GPUs.
func (e ContainerEnv) UnitsPerGPU() uint64 {
	return e.ContainerUnits / uint64(e.Set().Len())
}
