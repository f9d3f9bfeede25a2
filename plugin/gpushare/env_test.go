package gpushare_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestContainerEnvMap(t *testing.T) {
	e := gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15}
	want := map[string]string{
		"NVIDIA_VISIBLE_DEVICES":       "1",
		"ALIYUN_COM_GPU_MEM_IDX":       "1",
		"ALIYUN_COM_GPU_MEM_POD":       "4",
		"ALIYUN_COM_GPU_MEM_CONTAINER": "3",
		"ALIYUN_COM_GPU_MEM_DEV":       "15",
	}
	if got := e.Map(); !reflect.DeepEqual(got, want) {
		t.Errorf("Map = %v; want %v", got, want)
	}
	e.DisableIsolation = true
	want["CGPU_DISABLE"] = "true"
	if got := e.Map(); !reflect.DeepEqual(got, want) {
		t.Errorf("Map with isolation off = %v; want %v", got, want)
	}
	e.Isolation = gpushare.IsolationNone
	want["GPUSHARE_ISOLATION"] = "none"
	if got := e.Map(); !reflect.DeepEqual(got, want) {
		t.Errorf("Map on tier none = %v; want %v", got, want)
	}
	e.Isolation, e.ComputePercent = gpushare.IsolationMPS, 30
	want["GPUSHARE_ISOLATION"], want["GPUSHARE_COMPUTE_PERCENT"] = "mps", "30"
	if got := e.Map(); !reflect.DeepEqual(got, want) {
		t.Errorf("Map on tier mps with a compute share = %v; want %v", got, want)
	}
}

func TestParseContainerEnv(t *testing.T) {
	good := gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15}.Map()
	tests := []struct {
		name    string
		in      map[string]string
		want    gpushare.ContainerEnv
		wantKey string // key named in the error; "" for success
	}{
		{"ours", good, gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15}, ""},
		{"other variables ignored", with(good, "PATH", "/bin"), gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15}, ""},
		{"isolation off", with(good, "CGPU_DISABLE", "true"), gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15, DisableIsolation: true}, ""},
		{"isolation explicitly on", with(good, "CGPU_DISABLE", "false"), gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15}, ""},
		{"legacy UUID", with(good, "NVIDIA_VISIBLE_DEVICES", "GPU-8a9b3c2d-0000-1111-2222-333344445555"), gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15}, ""},
		{"volume-mounts strategy", with(good, "NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices"), gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15}, ""},
		{"CDI strategies", with(good, "NVIDIA_VISIBLE_DEVICES", "void"), gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15}, ""},
		{"another mount directory", with(good, "NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices/1"), gpushare.ContainerEnv{}, "NVIDIA_VISIBLE_DEVICES"},
		{"old failure marker", with(good, "NVIDIA_VISIBLE_DEVICES", "no-gpu-has-4GiB-to-run"), gpushare.ContainerEnv{}, "NVIDIA_VISIBLE_DEVICES"},
		{"other GPU visible", with(good, "NVIDIA_VISIBLE_DEVICES", "0"), gpushare.ContainerEnv{}, "NVIDIA_VISIBLE_DEVICES"},
		{"all GPUs visible", with(good, "NVIDIA_VISIBLE_DEVICES", "all"), gpushare.ContainerEnv{}, "NVIDIA_VISIBLE_DEVICES"},
		{"no visible devices", with(good, "NVIDIA_VISIBLE_DEVICES", "<absent>"), gpushare.ContainerEnv{}, "NVIDIA_VISIBLE_DEVICES"},
		{"no index", with(good, "ALIYUN_COM_GPU_MEM_IDX", "<absent>"), gpushare.ContainerEnv{}, "ALIYUN_COM_GPU_MEM_IDX"},
		{"bad index", with(good, "ALIYUN_COM_GPU_MEM_IDX", "-1"), gpushare.ContainerEnv{}, "ALIYUN_COM_GPU_MEM_IDX"},
		{"no pod units", with(good, "ALIYUN_COM_GPU_MEM_POD", "<absent>"), gpushare.ContainerEnv{}, "ALIYUN_COM_GPU_MEM_POD"},
		{"bad container units", with(good, "ALIYUN_COM_GPU_MEM_CONTAINER", "3.5"), gpushare.ContainerEnv{}, "ALIYUN_COM_GPU_MEM_CONTAINER"},
		{"bad dev units", with(good, "ALIYUN_COM_GPU_MEM_DEV", "99999999"), gpushare.ContainerEnv{}, "ALIYUN_COM_GPU_MEM_DEV"},
		{"bad isolation flag", with(good, "CGPU_DISABLE", "1"), gpushare.ContainerEnv{}, "CGPU_DISABLE"},
		{"empty", nil, gpushare.ContainerEnv{}, "ALIYUN_COM_GPU_MEM_IDX"},
		{"tier none", with(good, "GPUSHARE_ISOLATION", "none"), gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15, Isolation: "none"}, ""},
		{"tier hami-core", with(good, "GPUSHARE_ISOLATION", "hami-core"), gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15, Isolation: "hami-core"}, ""},
		{"tier and share", with(with(good, "GPUSHARE_ISOLATION", "mps"), "GPUSHARE_COMPUTE_PERCENT", "100"),
			gpushare.ContainerEnv{GPUIndex: 1, PodUnits: 4, ContainerUnits: 3, DevUnits: 15, Isolation: "mps", ComputePercent: 100}, ""},
		{"a pod's tier any", with(good, "GPUSHARE_ISOLATION", "any"), gpushare.ContainerEnv{}, "GPUSHARE_ISOLATION"},
		{"padded tier", with(good, "GPUSHARE_ISOLATION", " mps"), gpushare.ContainerEnv{}, "GPUSHARE_ISOLATION"},
		{"empty tier", with(good, "GPUSHARE_ISOLATION", ""), gpushare.ContainerEnv{}, "GPUSHARE_ISOLATION"},
		{"share without a tier", with(good, "GPUSHARE_COMPUTE_PERCENT", "50"), gpushare.ContainerEnv{}, "GPUSHARE_COMPUTE_PERCENT"},
		{"share on tier none", with(with(good, "GPUSHARE_ISOLATION", "none"), "GPUSHARE_COMPUTE_PERCENT", "50"), gpushare.ContainerEnv{}, "GPUSHARE_COMPUTE_PERCENT"},
		{"share zero", with(with(good, "GPUSHARE_ISOLATION", "mps"), "GPUSHARE_COMPUTE_PERCENT", "0"), gpushare.ContainerEnv{}, "GPUSHARE_COMPUTE_PERCENT"},
		{"share above 100", with(with(good, "GPUSHARE_ISOLATION", "mps"), "GPUSHARE_COMPUTE_PERCENT", "101"), gpushare.ContainerEnv{}, "GPUSHARE_COMPUTE_PERCENT"},
		{"share with a leading zero", with(with(good, "GPUSHARE_ISOLATION", "mps"), "GPUSHARE_COMPUTE_PERCENT", "050"), gpushare.ContainerEnv{}, "GPUSHARE_COMPUTE_PERCENT"},
	}
	for _, tt := range tests {
		got, err := gpushare.ParseContainerEnv(tt.in)
		if tt.wantKey != "" {
			var ee *gpushare.EnvError
			if !errors.Is(err, gpushare.ErrInvalidEnv) || !errors.As(err, &ee) || ee.Key != tt.wantKey {
				t.Errorf("%s: error = %v; want *EnvError on %s", tt.name, err, tt.wantKey)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: ParseContainerEnv = %+v, %v; want %+v", tt.name, got, err, tt.want)
		}
	}
}

// FuzzParseContainerEnv fuzzes the eight variables; bit i of present says
// whether the i-th is set at all.
func FuzzParseContainerEnv(f *testing.F) {
	keys := []string{
		gpushare.EnvVisibleDevices, gpushare.EnvGPUIndex, gpushare.EnvPodUnits,
		gpushare.EnvContainerUnits, gpushare.EnvDevUnits, gpushare.EnvDisableIsolation,
		gpushare.EnvIsolation, gpushare.EnvComputePercent,
	}
	f.Add(uint8(0x1f), "1", "1", "4", "3", "15", "", "", "")
	f.Add(uint8(0x3f), "0", "0", "2", "2", "79", "true", "", "")
	f.Add(uint8(0x3f), "GPU-abc", "2", "1", "1", "15", "false", "", "")
	f.Add(uint8(0x1f), "no-gpu-has-4GiB-to-run", "0", "4", "4", "15", "", "", "")
	f.Add(uint8(0x1f), "01", "1", "4", "3", "15", "", "", "")
	f.Add(uint8(0x1f), "/var/run/nvidia-container-devices", "1", "4", "3", "15", "", "", "")
	f.Add(uint8(0x3f), "void", "7", "9", "9", "80", "false", "", "")
	f.Add(uint8(0x5f), "1", "1", "4", "3", "15", "", "none", "")
	f.Add(uint8(0xdf), "1", "1", "4", "3", "15", "", "mps", "40")
	f.Add(uint8(0xdf), "void", "1", "4", "3", "15", "", "hami-core", "100")
	f.Add(uint8(0xdf), "1", "1", "4", "3", "15", "", "none", "40")
	f.Add(uint8(0x9f), "1", "1", "4", "3", "15", "", "", "7")
	f.Fuzz(func(t *testing.T, present uint8, vis, idx, pod, ctr, dev, cgpu, tier, percent string) {
		in := map[string]string{}
		for i, v := range []string{vis, idx, pod, ctr, dev, cgpu, tier, percent} {
			if present&(1<<i) != 0 {
				in[keys[i]] = v
			}
		}
		e, err := gpushare.ParseContainerEnv(in)
		if err != nil {
			if !errors.Is(err, gpushare.ErrInvalidEnv) {
				t.Fatalf("ParseContainerEnv(%v) error %v is not ErrInvalidEnv", in, err)
			}
			return
		}
		again, err := gpushare.ParseContainerEnv(e.Map())
		if err != nil || again != e {
			t.Fatalf("round trip %v → %v → %+v, %v; want %+v", in, e.Map(), again, err, e)
		}
	})
}
