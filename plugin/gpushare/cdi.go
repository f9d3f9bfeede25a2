package gpushare

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
)

// The isolation tier's variables as CDI container edits. The kubelet puts a
// device plugin's environment before the container's own env and envFrom,
// and the runtime keeps the last value of a name, so a container can replace
// any variable of the Allocate answer, its memory limit included. A runtime
// applies CDI container edits after the container's own environment,
// replacing a value it already has: under a CDI device-list strategy the
// plugin names, beside the GPU's CDI device, a device of its own kind whose
// edits are the tier's variables, and the container cannot lift them with
// its env. The device is a function of those variables alone (its name is
// their digest), so the answer stays a function of the container's
// signature (docs/design.md, race-free Allocate).
const (
	// CDILimitsKind is the CDI vendor/class of the plugin's devices.
	CDILimitsKind = "gpushare.io/limits"
	// CDILimitsSpecFile is the name of the plugin's CDI specification in its
	// CDI spec directory: CDI's convention <vendor>-<class>, and .json, which
	// every CDI reader accepts.
	CDILimitsSpecFile = "gpushare.io-limits.json"
	// CDILimitsSpecVersion is the specification's cdiVersion: env edits on
	// devices named with a leading letter need nothing newer than 0.3.0, the
	// oldest version current CDI readers accept, and older runtimes (whose
	// CDI refuses versions it does not know) read it too.
	CDILimitsSpecVersion = "0.3.0"
	// DefaultCDISpecDir is where the plugin writes its specification: CDI's
	// directory for generated specifications, one of containerd's and
	// CRI-O's default cdi_spec_dirs.
	DefaultCDISpecDir = "/var/run/cdi"
	// CDILimitsAnnotationPlugin is the device part of the cdi-annotations
	// strategy's key for the limits device (CDILimitsAnnotationKey).
	CDILimitsAnnotationPlugin = "limits"
	// CDILimitsAnnotationKey is the cdi-annotations strategy's annotation
	// naming the limits device; the GPUs' keys end in their index instead.
	CDILimitsAnnotationKey = CDIAnnotationPrefix + CDIAnnotationPlugin + "_" + CDILimitsAnnotationPlugin
)

// CDISpec is a CDI specification as the plugin writes it: devices whose only
// container edits are environment variables, "NAME=value".
type CDISpec struct {
	Version string      `json:"cdiVersion"`
	Kind    string      `json:"kind"`
	Devices []CDIDevice `json:"devices"`
}

// CDIDevice is one device of a CDISpec.
type CDIDevice struct {
	Name           string            `json:"name"`
	ContainerEdits CDIContainerEdits `json:"containerEdits"`
}

// CDIContainerEdits are a device's edits.
type CDIContainerEdits struct {
	Env []string `json:"env"`
}

// CDILimitsEnv is the limits device's env edits for the variables envs:
// "NAME=value", sorted by name, so equal variables make equal edits.
func CDILimitsEnv(envs map[string]string) []string {
	out := make([]string, 0, len(envs))
	for _, k := range slices.Sorted(maps.Keys(envs)) {
		out = append(out, k+"="+envs[k])
	}
	return out
}

// CDILimitsDeviceName names the limits device of tier carrying the edits env
// (CDILimitsEnv): the tier and the first 128 bits of the SHA-256 of the
// edits, one per line, e.g. hami-core-3f1c…. A name thus always means the
// same edits, on every node and across restarts, and starts with a letter
// as cdiVersion 0.3.0 requires.
func CDILimitsDeviceName(tier Isolation, env []string) string {
	sum := sha256.Sum256([]byte(strings.Join(env, "\n")))
	return string(tier) + "-" + hex.EncodeToString(sum[:16])
}

// CDILimitsDeviceMatches reports whether name is the name
// CDILimitsDeviceName gives the edits env under one of the tiers that limit.
func CDILimitsDeviceMatches(name string, env []string) bool {
	for _, t := range []Isolation{IsolationMPS, IsolationHAMiCore} {
		if name == CDILimitsDeviceName(t, env) {
			return true
		}
	}
	return false
}

// CDILimitsDevice is the fully qualified CDI name of the limits device name,
// gpushare.io/limits=<name>.
func CDILimitsDevice(name string) string {
	return CDILimitsKind + "=" + name
}
