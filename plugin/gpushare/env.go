package gpushare

import (
	"strconv"
	"strings"
)

// ContainerEnv is the environment our device plugin returns from Allocate for
// one container (contract section 3).
type ContainerEnv struct {
	GPUIndex         int    // EnvGPUIndex and EnvVisibleDevices
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
// runtime exposes exactly the GPU the scheduler charged.
func (e ContainerEnv) Map() map[string]string {
	idx := strconv.Itoa(e.GPUIndex)
	m := map[string]string{
		EnvVisibleDevices: idx,
		EnvGPUIndex:       idx,
		EnvPodUnits:       uintString(e.PodUnits),
		EnvContainerUnits: uintString(e.ContainerUnits),
		EnvDevUnits:       uintString(e.DevUnits),
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
// NVIDIA_VISIBLE_DEVICES must name the same GPU index. A GPU UUID there (the
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
	idx, reason := parseGPUIndex(raw)
	if reason != "" {
		return ContainerEnv{}, &EnvError{Key: EnvGPUIndex, Value: raw, Reason: reason}
	}
	e.GPUIndex = idx
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
		if v, reason := parseGPUIndex(vis); reason != "" || v != idx {
			return ContainerEnv{}, &EnvError{Key: EnvVisibleDevices, Value: vis, Reason: "does not name GPU index " + strconv.Itoa(idx)}
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
	return e, nil
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
