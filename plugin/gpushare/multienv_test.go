package gpushare_test

import (
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestMultiGPUContainerEnvMap(t *testing.T) {
	e := gpushare.ContainerEnv{GPUIndex: 2, GPUs: gpushare.NewGPUSet(2, 10), PodUnits: 12, ContainerUnits: 8, DevUnits: 80}
	want := map[string]string{
		"NVIDIA_VISIBLE_DEVICES":       "2,10",
		"ALIYUN_COM_GPU_MEM_IDX":       "2,10",
		"ALIYUN_COM_GPU_MEM_POD":       "12",
		"ALIYUN_COM_GPU_MEM_CONTAINER": "8",
		"ALIYUN_COM_GPU_MEM_DEV":       "80",
		"GPUSHARE_GPU_COUNT":           "2",
	}
	if got := e.Map(); !reflect.DeepEqual(got, want) {
		t.Errorf("Map() = %v; want %v", got, want)
	}
	if e.Set() != e.GPUs || e.UnitsPerGPU() != 4 {
		t.Errorf("Set() = %v, UnitsPerGPU() = %d; want %v, 4", e.Set(), e.UnitsPerGPU(), e.GPUs)
	}
	// A single-GPU env is unchanged: no count, a plain index.
	single := gpushare.ContainerEnv{GPUIndex: 3, PodUnits: 4, ContainerUnits: 4, DevUnits: 15}
	m := single.Map()
	if _, ok := m[gpushare.EnvGPUCount]; ok || m[gpushare.EnvGPUIndex] != "3" || m[gpushare.EnvVisibleDevices] != "3" {
		t.Errorf("single-GPU Map() = %v", m)
	}
	if single.Set() != gpushare.NewGPUSet(3) || single.UnitsPerGPU() != 4 {
		t.Errorf("single-GPU Set() = %v, UnitsPerGPU() = %d", single.Set(), single.UnitsPerGPU())
	}
	// A one-GPU set is written as that one GPU.
	one := gpushare.ContainerEnv{GPUIndex: 5, GPUs: gpushare.NewGPUSet(5), PodUnits: 4, ContainerUnits: 4, DevUnits: 15}
	if m := one.Map(); m[gpushare.EnvGPUIndex] != "5" || m[gpushare.EnvVisibleDevices] != "5" {
		t.Errorf("one-GPU set Map() = %v", m)
	} else if _, ok := m[gpushare.EnvGPUCount]; ok {
		t.Errorf("one-GPU set Map() = %v has a count", m)
	}
}

func TestMultiGPUContainerEnvRoundTrip(t *testing.T) {
	for _, e := range []gpushare.ContainerEnv{
		{GPUIndex: 0, GPUs: gpushare.NewGPUSet(0, 1), PodUnits: 8, ContainerUnits: 8, DevUnits: 80},
		{GPUIndex: 0, GPUs: gpushare.NewGPUSet(0, 63), PodUnits: 10, ContainerUnits: 4, DevUnits: 80, DisableIsolation: true},
		{GPUIndex: 2, GPUs: gpushare.NewGPUSet(2, 10, 63), PodUnits: 9, ContainerUnits: 9, DevUnits: 40, Isolation: gpushare.IsolationMPS, ComputePercent: 50},
		{GPUIndex: 62, GPUs: gpushare.NewGPUSet(62, 63), PodUnits: 2, ContainerUnits: 2, DevUnits: 1, Isolation: gpushare.IsolationNone},
	} {
		got, err := gpushare.ParseContainerEnv(e.Map())
		if err != nil || got != e {
			t.Errorf("ParseContainerEnv(%v) = %+v, %v; want %+v", e.Map(), got, err, e)
		}
		// The record and the environment read back alike.
		enc, err := gpushare.EncodeContainerEnvs(gpushare.ContainerEnvs{"c": e})
		if err != nil {
			t.Errorf("EncodeContainerEnvs(%+v) = %v", e, err)
			continue
		}
		rec, err := gpushare.DecodeContainerEnvs(enc)
		if err != nil || rec["c"] != e {
			t.Errorf("DecodeContainerEnvs(%s) = %+v, %v; want %+v", enc, rec, err, e)
		}
	}
}

func multiEnv(changes map[string]string) map[string]string {
	env := map[string]string{
		gpushare.EnvVisibleDevices: "0,1",
		gpushare.EnvGPUIndex:       "0,1",
		gpushare.EnvPodUnits:       "8",
		gpushare.EnvContainerUnits: "4",
		gpushare.EnvDevUnits:       "80",
		gpushare.EnvGPUCount:       "2",
		"PATH":                     "/bin",
	}
	for k, v := range changes {
		if v == "<absent>" {
			delete(env, k)
		} else {
			env[k] = v
		}
	}
	return env
}

func TestParseMultiGPUContainerEnv(t *testing.T) {
	both := gpushare.ContainerEnv{GPUIndex: 0, GPUs: gpushare.NewGPUSet(0, 1), PodUnits: 8, ContainerUnits: 4, DevUnits: 80}
	for _, tt := range []struct {
		name    string
		changes map[string]string
		want    gpushare.ContainerEnv
		key     string // EnvError.Key; "" for success
	}{
		{name: "as Map writes it", want: both},
		{name: "count absent", changes: map[string]string{gpushare.EnvGPUCount: "<absent>"}, want: both},
		{name: "GPU UUIDs", changes: map[string]string{gpushare.EnvVisibleDevices: "GPU-1111,GPU-2222"}, want: both},
		{name: "one GPU UUID", changes: map[string]string{gpushare.EnvVisibleDevices: "GPU-1111"}, want: both},
		{name: "device-list mount", changes: map[string]string{gpushare.EnvVisibleDevices: gpushare.DeviceListMountDir}, want: both},
		{name: "void", changes: map[string]string{gpushare.EnvVisibleDevices: gpushare.VisibleDevicesVoid}, want: both},
		{
			name:    "single GPU with count 1",
			changes: map[string]string{gpushare.EnvGPUIndex: "3", gpushare.EnvVisibleDevices: "3", gpushare.EnvGPUCount: "1", gpushare.EnvContainerUnits: "3"},
			want:    gpushare.ContainerEnv{GPUIndex: 3, PodUnits: 8, ContainerUnits: 3, DevUnits: 80},
		},
		{
			name:    "single GPU without count",
			changes: map[string]string{gpushare.EnvGPUIndex: "63", gpushare.EnvVisibleDevices: "63", gpushare.EnvGPUCount: "<absent>", gpushare.EnvContainerUnits: "3"},
			want:    gpushare.ContainerEnv{GPUIndex: 63, PodUnits: 8, ContainerUnits: 3, DevUnits: 80},
		},
		{name: "count too high", changes: map[string]string{gpushare.EnvGPUCount: "3"}, key: gpushare.EnvGPUCount},
		{name: "count too low", changes: map[string]string{gpushare.EnvGPUCount: "1"}, key: gpushare.EnvGPUCount},
		{name: "count zero", changes: map[string]string{gpushare.EnvGPUCount: "0"}, key: gpushare.EnvGPUCount},
		{name: "count empty", changes: map[string]string{gpushare.EnvGPUCount: ""}, key: gpushare.EnvGPUCount},
		{name: "count not a number", changes: map[string]string{gpushare.EnvGPUCount: "two"}, key: gpushare.EnvGPUCount},
		{name: "count 2 on a single GPU", changes: map[string]string{gpushare.EnvGPUIndex: "0", gpushare.EnvVisibleDevices: "0"}, key: gpushare.EnvGPUCount},
		{name: "descending index list", changes: map[string]string{gpushare.EnvGPUIndex: "1,0", gpushare.EnvVisibleDevices: "1,0"}, key: gpushare.EnvGPUIndex},
		{name: "repeated index", changes: map[string]string{gpushare.EnvGPUIndex: "0,0", gpushare.EnvVisibleDevices: "0,0"}, key: gpushare.EnvGPUIndex},
		{name: "index out of range", changes: map[string]string{gpushare.EnvGPUIndex: "0,64", gpushare.EnvVisibleDevices: "0,64"}, key: gpushare.EnvGPUIndex},
		{name: "index with spaces", changes: map[string]string{gpushare.EnvGPUIndex: "0, 1", gpushare.EnvVisibleDevices: "0, 1"}, key: gpushare.EnvGPUIndex},
		{name: "index trailing comma", changes: map[string]string{gpushare.EnvGPUIndex: "0,1,", gpushare.EnvVisibleDevices: "0,1,"}, key: gpushare.EnvGPUIndex},
		{name: "visible devices other GPUs", changes: map[string]string{gpushare.EnvVisibleDevices: "0,2"}, key: gpushare.EnvVisibleDevices},
		{name: "visible devices first GPU only", changes: map[string]string{gpushare.EnvVisibleDevices: "0"}, key: gpushare.EnvVisibleDevices},
		{name: "visible devices more GPUs", changes: map[string]string{gpushare.EnvVisibleDevices: "0,1,2"}, key: gpushare.EnvVisibleDevices},
		{name: "visible devices descending", changes: map[string]string{gpushare.EnvVisibleDevices: "1,0"}, key: gpushare.EnvVisibleDevices},
		{name: "visible devices all", changes: map[string]string{gpushare.EnvVisibleDevices: "all"}, key: gpushare.EnvVisibleDevices},
		{name: "visible devices missing", changes: map[string]string{gpushare.EnvVisibleDevices: "<absent>"}, key: gpushare.EnvVisibleDevices},
		{name: "units not divisible", changes: map[string]string{gpushare.EnvContainerUnits: "3"}, key: gpushare.EnvContainerUnits},
		{
			name:    "units not divisible over three",
			changes: map[string]string{gpushare.EnvGPUIndex: "0,1,2", gpushare.EnvVisibleDevices: "0,1,2", gpushare.EnvGPUCount: "3", gpushare.EnvContainerUnits: "4"},
			key:     gpushare.EnvContainerUnits,
		},
	} {
		env := multiEnv(tt.changes)
		got, err := gpushare.ParseContainerEnv(env)
		if tt.key == "" {
			if err != nil || got != tt.want {
				t.Errorf("%s: ParseContainerEnv(%v) = %+v, %v; want %+v", tt.name, env, got, err, tt.want)
			}
			continue
		}
		var ee *gpushare.EnvError
		if !errors.Is(err, gpushare.ErrInvalidEnv) || !errors.As(err, &ee) || got != (gpushare.ContainerEnv{}) {
			t.Errorf("%s: ParseContainerEnv(%v) = %+v, %v; want ErrInvalidEnv", tt.name, env, got, err)
			continue
		}
		if ee.Key != tt.key {
			t.Errorf("%s: error key %s; want %s (%v)", tt.name, ee.Key, tt.key, err)
		}
	}
}

func TestMultiGPUContainerEnvsRecord(t *testing.T) {
	rec := gpushare.ContainerEnvs{
		"main":  {GPUIndex: 0, GPUs: gpushare.NewGPUSet(0, 1), PodUnits: 10, ContainerUnits: 8, DevUnits: 80},
		"aux":   {GPUIndex: 0, GPUs: gpushare.NewGPUSet(0, 1), PodUnits: 10, ContainerUnits: 2, DevUnits: 80, DisableIsolation: true, Isolation: gpushare.IsolationMPS, ComputePercent: 30},
		"setup": {GPUIndex: 0, GPUs: gpushare.NewGPUSet(0, 1), PodUnits: 10, ContainerUnits: 10, DevUnits: 80},
	}
	const want = `{"aux":{"gpu":0,"pod":10,"container":2,"dev":80,"gpus":"0,1","cgpuDisable":true,"isolation":"mps","computePercent":30},` +
		`"main":{"gpu":0,"pod":10,"container":8,"dev":80,"gpus":"0,1"},` +
		`"setup":{"gpu":0,"pod":10,"container":10,"dev":80,"gpus":"0,1"}}`
	enc, err := gpushare.EncodeContainerEnvs(rec)
	if err != nil || enc != want {
		t.Fatalf("EncodeContainerEnvs = %s, %v; want %s", enc, err, want)
	}
	back, err := gpushare.DecodeContainerEnvs(enc)
	if err != nil || !maps.Equal(back, rec) {
		t.Errorf("DecodeContainerEnvs(%s) = %v, %v; want %v", enc, back, err, rec)
	}
	// A sparse set far from 0.
	sparse := gpushare.ContainerEnvs{"x": {GPUIndex: 7, GPUs: gpushare.NewGPUSet(7, 12, 63), PodUnits: 3, ContainerUnits: 3, DevUnits: 1}}
	enc, err = gpushare.EncodeContainerEnvs(sparse)
	if want := `{"x":{"gpu":7,"pod":3,"container":3,"dev":1,"gpus":"7,12,63"}}`; err != nil || enc != want {
		t.Errorf("EncodeContainerEnvs = %s, %v; want %s", enc, err, want)
	}
	if back, err := gpushare.DecodeContainerEnvs(enc); err != nil || !maps.Equal(back, sparse) {
		t.Errorf("DecodeContainerEnvs(%s) = %v, %v", enc, back, err)
	}
}

// Records without gpus, whether alone or beside a multi-GPU container, keep
// the bytes they had before issue 15.
func TestContainerEnvsWithoutGPUsKeepTheirBytes(t *testing.T) {
	for _, old := range []string{
		`{"main":{"gpu":3,"pod":4,"container":2,"dev":80}}`,
		`{"app":{"gpu":1,"pod":6,"container":5,"dev":15},"side":{"gpu":0,"pod":6,"container":1,"dev":15,"cgpuDisable":true,"isolation":"mps","computePercent":20}}`,
	} {
		rec, err := gpushare.DecodeContainerEnvs(old)
		if err != nil {
			t.Fatal(err)
		}
		for name, e := range rec {
			if e.GPUs != 0 {
				t.Errorf("%s: %s decoded with GPUs %v", old, name, e.GPUs)
			}
		}
		if got, err := gpushare.EncodeContainerEnvs(rec); err != nil || got != old {
			t.Errorf("re-encoded %s as %s, %v", old, got, err)
		}
	}
	rec := gpushare.ContainerEnvs{"old": {GPUIndex: 3, PodUnits: 4, ContainerUnits: 2, DevUnits: 80}}
	if got, err := gpushare.EncodeContainerEnvs(rec); err != nil || got != `{"old":{"gpu":3,"pod":4,"container":2,"dev":80}}` {
		t.Errorf("EncodeContainerEnvs(%v) = %s, %v", rec, got, err)
	}
	// "gpus":null is absence, like a null tier.
	if got, err := gpushare.DecodeContainerEnvs(`{"a":{"gpu":0,"pod":1,"container":1,"dev":1,"gpus":null}}`); err != nil || got["a"].GPUs != 0 {
		t.Errorf(`"gpus":null decoded as %v, %v`, got, err)
	}
}

func TestMultiGPUContainerEnvsRejects(t *testing.T) {
	encode := []struct {
		name string
		e    gpushare.ContainerEnv
		path string
	}{
		{"gpus not starting with gpu", gpushare.ContainerEnv{GPUIndex: 0, GPUs: gpushare.NewGPUSet(1, 2), PodUnits: 4, ContainerUnits: 4, DevUnits: 80}, `"c".gpus`},
		{"gpu in the set but not first", gpushare.ContainerEnv{GPUIndex: 1, GPUs: gpushare.NewGPUSet(0, 1), PodUnits: 4, ContainerUnits: 4, DevUnits: 80}, `"c".gpus`},
		{"single-element gpus", gpushare.ContainerEnv{GPUIndex: 0, GPUs: gpushare.NewGPUSet(0), PodUnits: 4, ContainerUnits: 4, DevUnits: 80}, `"c".gpus`},
		{"units not divisible", gpushare.ContainerEnv{GPUIndex: 0, GPUs: gpushare.NewGPUSet(0, 1), PodUnits: 4, ContainerUnits: 3, DevUnits: 80}, `"c".container`},
	}
	for _, tt := range encode {
		got, err := gpushare.EncodeContainerEnvs(gpushare.ContainerEnvs{"c": tt.e})
		var ce *gpushare.ContainerEnvsError
		if !errors.Is(err, gpushare.ErrInvalidContainerEnvs) || !errors.As(err, &ce) || got != "" {
			t.Errorf("%s: EncodeContainerEnvs = %q, %v; want ErrInvalidContainerEnvs", tt.name, got, err)
			continue
		}
		if ce.Path != tt.path {
			t.Errorf("%s: error path %s; want %s (%v)", tt.name, ce.Path, tt.path, err)
		}
	}
	const head = `{"c":{"gpu":0,"pod":4,"container":4,"dev":80,"gpus":`
	for _, tt := range []struct {
		gpus string // raw JSON
		path string
		msg  string
	}{
		{`"1,2"`, `"c".gpus`, "starting with gpu 0"},
		{`"0"`, `"c".gpus`, "several"},
		{`"1,0"`, `"c".gpus`, "ascending"},
		{`"0,0"`, `"c".gpus`, "ascending"},
		{`""`, `"c".gpus`, "empty"},
		{`"0,"`, `"c".gpus`, "empty"},
		{`"0,64"`, `"c".gpus`, "above the limit"},
		{`"x,y"`, `"c".gpus`, "not a non-negative decimal integer"},
		{`"0, 1"`, `"c".gpus`, ""},
		{`"GPU-1,GPU-2"`, `"c".gpus`, ""},
		{`"0,1,2"`, `"c".container`, "divide"},
		{`[0,1]`, `"c"`, ""},
		{`1`, `"c"`, ""},
	} {
		s := head + tt.gpus + `}}`
		got, err := gpushare.DecodeContainerEnvs(s)
		var ce *gpushare.ContainerEnvsError
		if !errors.Is(err, gpushare.ErrInvalidContainerEnvs) || !errors.As(err, &ce) || got != nil {
			t.Errorf("DecodeContainerEnvs(%s) = %v, %v; want ErrInvalidContainerEnvs", s, got, err)
			continue
		}
		if ce.Path != tt.path || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("DecodeContainerEnvs(%s): error %v (path %s); want path %s mentioning %q", s, err, ce.Path, tt.path, tt.msg)
		}
	}
}
