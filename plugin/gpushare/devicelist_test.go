package gpushare_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestParseDeviceListStrategies(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want gpushare.DeviceListStrategies
	}{
		{"envvar", gpushare.DeviceListStrategies{gpushare.DeviceListEnvvar}},
		{"volume-mounts", gpushare.DeviceListStrategies{gpushare.DeviceListVolumeMounts}},
		{"cdi-annotations", gpushare.DeviceListStrategies{gpushare.DeviceListCDIAnnotations}},
		{"cdi-cri", gpushare.DeviceListStrategies{gpushare.DeviceListCDICRI}},
		{"envvar, cdi-cri", gpushare.DeviceListStrategies{gpushare.DeviceListEnvvar, gpushare.DeviceListCDICRI}},
		{"cdi-cri,cdi-annotations,cdi-cri", gpushare.DeviceListStrategies{gpushare.DeviceListCDICRI, gpushare.DeviceListCDIAnnotations}},
	} {
		got, err := gpushare.ParseDeviceListStrategies(tt.in)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseDeviceListStrategies(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
		if again, err := gpushare.ParseDeviceListStrategies(got.String()); err != nil || !slices.Equal(again, got) {
			t.Errorf("%q: String %q reads back as %v, %v", tt.in, got.String(), again, err)
		}
	}
	for _, in := range []string{"", "env", "envvar,", "ENVVAR", "volume-mounts;cdi-cri", "cdi"} {
		_, err := gpushare.ParseDeviceListStrategies(in)
		var se *gpushare.DeviceListStrategyError
		if !errors.Is(err, gpushare.ErrInvalidDeviceListStrategy) || !errors.As(err, &se) ||
			!strings.Contains(err.Error(), "envvar, volume-mounts, cdi-annotations, cdi-cri") {
			t.Errorf("ParseDeviceListStrategies(%q) = %v; want an error listing the valid strategies", in, err)
		}
	}
}

func TestDeviceListStrategiesSet(t *testing.T) {
	var none gpushare.DeviceListStrategies
	if !none.Includes(gpushare.DeviceListEnvvar) || none.Includes(gpushare.DeviceListCDICRI) || none.OnlyCDI() || none.String() != "envvar" {
		t.Errorf("the empty set must mean envvar alone")
	}
	for _, tt := range []struct {
		s       gpushare.DeviceListStrategies
		onlyCDI bool
	}{
		{gpushare.DeviceListStrategies{gpushare.DeviceListEnvvar}, false},
		{gpushare.DeviceListStrategies{gpushare.DeviceListVolumeMounts}, false},
		{gpushare.DeviceListStrategies{gpushare.DeviceListCDICRI}, true},
		{gpushare.DeviceListStrategies{gpushare.DeviceListCDIAnnotations, gpushare.DeviceListCDICRI}, true},
		{gpushare.DeviceListStrategies{gpushare.DeviceListCDICRI, gpushare.DeviceListVolumeMounts}, false},
	} {
		if got := tt.s.OnlyCDI(); got != tt.onlyCDI {
			t.Errorf("%v.OnlyCDI() = %v; want %v", tt.s, got, tt.onlyCDI)
		}
	}
}

func TestParseDeviceIDStrategy(t *testing.T) {
	for _, in := range []string{"uuid", "index"} {
		if got, err := gpushare.ParseDeviceIDStrategy(in); err != nil || string(got) != in {
			t.Errorf("ParseDeviceIDStrategy(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "UUID", "indices", "uuid,index"} {
		if _, err := gpushare.ParseDeviceIDStrategy(in); !errors.Is(err, gpushare.ErrInvalidDeviceListStrategy) ||
			!strings.Contains(err.Error(), "want one of uuid, index") {
			t.Errorf("ParseDeviceIDStrategy(%q) = %v; want an error listing uuid, index", in, err)
		}
	}
}

// The names a node's runtime configuration depends on: NVIDIA's conventions,
// and the CDI annotation key rules (at most 63 characters after the prefix,
// alphanumeric at both ends, only [A-Za-z0-9_.-] inside).
func TestDeviceListNames(t *testing.T) {
	if got := gpushare.DeviceListMountPath("GPU-8a3c"); got != "/var/run/nvidia-container-devices/GPU-8a3c" {
		t.Errorf("DeviceListMountPath = %q", got)
	}
	if got := gpushare.CDIDeviceName("0"); got != "nvidia.com/gpu=0" {
		t.Errorf("CDIDeviceName = %q", got)
	}
	for _, gpu := range []int{0, 7, gpushare.MaxGPUsPerNode - 1} {
		key := gpushare.CDIAnnotationKey(gpu)
		name, ok := strings.CutPrefix(key, "cdi.k8s.io/")
		if !ok || len(name) > 63 || !alnum(name[0]) || !alnum(name[len(name)-1]) ||
			strings.IndexFunc(name, func(r rune) bool { return !(r < 128 && alnum(byte(r))) && !strings.ContainsRune("_.-", r) }) >= 0 {
			t.Errorf("CDIAnnotationKey(%d) = %q is not a valid CDI annotation key", gpu, key)
		}
	}
	if gpushare.CDIAnnotationKey(0) == gpushare.CDIAnnotationKey(1) {
		t.Error("two GPUs share a CDI annotation key")
	}
}

func alnum(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
