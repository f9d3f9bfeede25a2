package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParse(t *testing.T) {
	node := env(map[string]string{"NODE_NAME": "n1"})
	o, err := parse(nil, node, &bytes.Buffer{})
	if err != nil || o.backend != "nvml" || o.unit != gpushare.GiB || o.dir != "/var/lib/kubelet/device-plugins" ||
		!o.healthCheck || o.quiet != 5*time.Minute || o.node != "n1" || o.kubeconfig != "" || o.qps != 50 || o.burst != 100 {
		t.Errorf("defaults = %+v, %v", o, err)
	}
	o, err = parse([]string{"--memory-unit=256MiB", "--gpu-backend=simulated:dgxh200", "--health-check=false",
		"--health-quiet-period=30s", "--device-plugin-dir=/tmp/dp", "--log-level=debug"}, node, &bytes.Buffer{})
	if err != nil || o.unit != 256 || o.backend != "simulated:dgxh200" || o.healthCheck || o.quiet != 30*time.Second || o.dir != "/tmp/dp" {
		t.Errorf("flags = %+v, %v", o, err)
	}
	if o, err := parse(nil, node, &bytes.Buffer{}); err != nil || o.deviceList.Strategies.String() != "envvar" || o.deviceList.IDs != gpushare.DeviceIDUUID ||
		o.cdiSpecDir != "/var/run/cdi" {
		t.Errorf("device list defaults = %v, %q, %v; want envvar (GPUs by uuid), /var/run/cdi", o.deviceList, o.cdiSpecDir, err)
	}
	if o, err := parse([]string{"--cdi-spec-dir=/etc/cdi"}, node, &bytes.Buffer{}); err != nil || o.cdiSpecDir != "/etc/cdi" {
		t.Errorf("--cdi-spec-dir=/etc/cdi = %q, %v", o.cdiSpecDir, err)
	}
	o, err = parse([]string{"--device-list-strategy=volume-mounts,cdi-cri", "--device-id-strategy=index"}, node, &bytes.Buffer{})
	if err != nil || !o.deviceList.Strategies.Includes(gpushare.DeviceListVolumeMounts) || !o.deviceList.Strategies.Includes(gpushare.DeviceListCDICRI) ||
		o.deviceList.Strategies.Includes(gpushare.DeviceListEnvvar) || o.deviceList.IDs != gpushare.DeviceIDIndex {
		t.Errorf("--device-list-strategy=volume-mounts,cdi-cri --device-id-strategy=index = %v, %v", o.deviceList, err)
	}
	if o, err := parse(nil, node, &bytes.Buffer{}); err != nil || o.isolation.tier != gpushare.IsolationNone || o.isolation.probeEvery != 2*time.Second ||
		o.isolation.controlBin != "nvidia-cuda-mps-control" || o.isolation.paths != (isolation.Config{
		MPSPipeDir: "/run/gpushare/mps/pipe", MPSShmDir: "/run/gpushare/mps/shm", HAMiLibrary: "/usr/local/vgpu/libvgpu.so",
		HAMiPreload: "/usr/local/vgpu/ld.so.preload", HAMiLockDir: "/tmp/vgpulock", HAMiCacheRoot: "/var/lib/gpushare/hami-cache"}) {
		t.Errorf("isolation defaults = %+v, %v", o.isolation, err)
	}
	o, err = parse([]string{"--isolation=hami-core", "--mps-control-bin=/opt/fake-mps-control", "--mps-pipe-dir=/tmp/p", "--mps-log-dir=/tmp/l",
		"--mps-shm-dir=/tmp/s", "--hami-core-library=/opt/vgpu/libvgpu.so.v2", "--hami-core-preload=/opt/vgpu/preload", "--hami-core-lock-dir=/tmp/lock",
		"--hami-core-cache-dir=/tmp/cache", "--isolation-probe-interval=100ms"}, node, &bytes.Buffer{})
	if err != nil || o.isolation.tier != gpushare.IsolationHAMiCore || o.isolation.controlBin != "/opt/fake-mps-control" || o.isolation.mpsLogDir != "/tmp/l" ||
		o.isolation.probeEvery != 100*time.Millisecond || o.isolation.paths != (isolation.Config{MPSPipeDir: "/tmp/p", MPSShmDir: "/tmp/s",
		HAMiLibrary: "/opt/vgpu/libvgpu.so.v2", HAMiPreload: "/opt/vgpu/preload", HAMiLockDir: "/tmp/lock", HAMiCacheRoot: "/tmp/cache"}) {
		t.Errorf("isolation flags = %+v, %v", o.isolation, err)
	}
	o, err = parse([]string{"--health-fatal-xids=62, 140", "--health-fatal-xids=31"}, node, &bytes.Buffer{})
	if err != nil || fmt.Sprint(o.fatalXids) != "[62 140 31]" {
		t.Errorf("--health-fatal-xids = %v, %v; want [62 140 31]", o.fatalXids, err)
	}
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "NODE_NAME is not set"},
		{[]string{"--memory-unit=3MiB"}, map[string]string{"NODE_NAME": "n"}, "divides 1024"},
		{[]string{"--health-quiet-period=0s"}, map[string]string{"NODE_NAME": "n"}, "must be positive"},
		{[]string{"--kube-api-qps=0"}, map[string]string{"NODE_NAME": "n"}, "--kube-api-qps and --kube-api-burst must be positive"},
		{[]string{"--kube-api-burst=-1"}, map[string]string{"NODE_NAME": "n"}, "--kube-api-qps and --kube-api-burst must be positive"},
		{[]string{"extra"}, map[string]string{"NODE_NAME": "n"}, "unexpected arguments"},
		{[]string{"--health-fatal-xids=62,x"}, map[string]string{"NODE_NAME": "n"}, `"x" is not an Xid`},
		{[]string{"--health-fatal-xids="}, map[string]string{"NODE_NAME": "n"}, `"" is not an Xid`},
		{[]string{"--log-level=loud"}, map[string]string{"NODE_NAME": "n"}, "loud"},
		{[]string{"--device-list-strategy=volume-mount"}, map[string]string{"NODE_NAME": "n"},
			`--device-list-strategy: invalid device list strategy "volume-mount": want one of envvar, volume-mounts, cdi-annotations, cdi-cri`},
		{[]string{"--device-list-strategy="}, map[string]string{"NODE_NAME": "n"}, "want one of envvar, volume-mounts, cdi-annotations, cdi-cri"},
		{[]string{"--device-id-strategy=serial"}, map[string]string{"NODE_NAME": "n"}, `--device-id-strategy: invalid device ID strategy "serial": want one of uuid, index`},
		{[]string{"--isolation=any"}, map[string]string{"NODE_NAME": "n"}, `"any" is not one of none, mps, hami-core`},
		{[]string{"--isolation=cgpu"}, map[string]string{"NODE_NAME": "n"}, `is not one of none, mps, hami-core`},
		{[]string{"--mps-pipe-dir=run/mps"}, map[string]string{"NODE_NAME": "n"}, `--mps-pipe-dir: "run/mps" is not a clean absolute path`},
		{[]string{"--hami-core-cache-dir=/var/lib/../cache"}, map[string]string{"NODE_NAME": "n"}, `--hami-core-cache-dir: "/var/lib/../cache" is not a clean absolute path`},
		{[]string{"--hami-core-library="}, map[string]string{"NODE_NAME": "n"}, `--hami-core-library: "" is not a clean absolute path`},
		{[]string{"--mps-log-dir=/run/gpushare/mps/pipe"}, map[string]string{"NODE_NAME": "n"}, "--mps-pipe-dir and --mps-log-dir must differ"},
		{[]string{"--isolation-probe-interval=0s"}, map[string]string{"NODE_NAME": "n"}, "--isolation-probe-interval must be positive"},
		{[]string{"--cdi-spec-dir=cdi"}, map[string]string{"NODE_NAME": "n"}, `--cdi-spec-dir: "cdi" is not a clean absolute path`},
		{[]string{"--cdi-spec-dir="}, map[string]string{"NODE_NAME": "n"}, `--cdi-spec-dir: "" is not a clean absolute path`},
	} {
		var stderr bytes.Buffer
		_, err := parse(tt.args, env(tt.env), &stderr)
		if err == nil || !strings.Contains(err.Error()+stderr.String(), tt.want) {
			t.Errorf("parse(%v) = %v (%s); want an error mentioning %q", tt.args, err, stderr.String(), tt.want)
		}
	}
}

func TestRunUsageErrorsExitTwo(t *testing.T) {
	var stderr bytes.Buffer
	if code := run([]string{"--memory-unit=7MiB"}, env(map[string]string{"NODE_NAME": "n"}), &stderr); code != 2 {
		t.Errorf("exit %d; want 2 (%s)", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"--device-list-strategy=cdi"}, env(map[string]string{"NODE_NAME": "n"}), &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "want one of envvar, volume-mounts, cdi-annotations, cdi-cri") {
		t.Errorf("exit %d (%s); want 2 and the valid strategies", code, stderr.String())
	}
	if code := run([]string{"-h"}, env(nil), &stderr); code != 0 {
		t.Errorf("-h exit %d; want 0", code)
	}
}

// A missing kubeconfig fails the command with exit status 1 before anything starts.
func TestRunFailsWithoutKubeconfig(t *testing.T) {
	var stderr bytes.Buffer
	code := run([]string{"--kubeconfig=/nonexistent", "--gpu-backend=simulated:dgxa100", "--log-level=error"}, env(map[string]string{"NODE_NAME": "n"}), &stderr)
	if code != 1 {
		t.Errorf("exit %d; want 1", code)
	}
}

// --metrics-listen serves the plugin's series on /metrics and nothing else;
// without it nothing listens.
func TestServeMetrics(t *testing.T) {
	if m, err := serveMetrics("", true, zap.NewNop()); err != nil || m.plugin != nil || m.usage != nil || m.addr != "" {
		t.Fatalf("serveMetrics(\"\") = %+v, %v; want nothing served", m, err)
	} else {
		m.stop()
	}
	m, err := serveMetrics("127.0.0.1:0", true, zap.NewNop())
	if err != nil || m.plugin == nil || m.usage == nil {
		t.Fatalf("serveMetrics = %+v, %v", m, err)
	}
	defer m.stop()
	addr := m.addr
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, `gpushare_plugin_allocate_total{outcome="overcommit"} 0`) ||
		!strings.Contains(body, `gpushare_usage_reads_total{outcome="error"} 0`) {
		t.Errorf("GET /metrics = %d %q", code, body)
	}
	if code, _ := get("/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("GET /debug/pprof/ = %d; want 404: only /metrics is served", code)
	}
	if _, err := serveMetrics("256.0.0.1:1", false, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "--metrics-listen") {
		t.Errorf("a bad address = %v; want an error naming the flag", err)
	}
}

// The tier configuration carries an MPS daemon on the flags' pipe directory
// for every GPU (a node label can select mps whatever the flag), and the
// manager accepts it.
func TestIsolationConfig(t *testing.T) {
	o, err := parse([]string{"--mps-pipe-dir=/tmp/gpushare-test/pipe", "--mps-log-dir=/tmp/gpushare-test/log"}, env(map[string]string{"NODE_NAME": "n"}), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	lib, err := nvml.NewSimulator(zap.NewNop(), "simulated:mixed")
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Shutdown()
	cfg, err := o.isolation.config(lib, zap.NewNop())
	if err != nil || cfg.Tier != gpushare.IsolationNone || cfg.MPS == nil || cfg.MPS.PipeDir() != "/tmp/gpushare-test/pipe" || cfg.Paths != o.isolation.paths {
		t.Fatalf("config = %+v, %v", cfg, err)
	}
	if _, err := manager.New(manager.Config{Node: "n", Client: fake.NewClientset(), Library: lib, Isolation: cfg}); err != nil {
		t.Errorf("manager.New refuses the configuration: %v", err)
	}
}

// The CDI strategies get the plugin's CDI specification in --cdi-spec-dir;
// the others, which cannot carry edits, none.
func TestLimitSpecsWiring(t *testing.T) {
	node := env(map[string]string{"NODE_NAME": "n1"})
	dir := t.TempDir()
	for list, want := range map[string]bool{"envvar": false, "volume-mounts": false, "cdi-cri": true, "cdi-annotations": true, "envvar,cdi-cri": true} {
		o, err := parse([]string{"--device-list-strategy=" + list, "--cdi-spec-dir=" + dir}, node, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		limits, err := limitSpecs(o, zap.NewNop())
		if err != nil || (limits != nil) != want || (want && limits.Path() != dir+"/gpushare.io-limits.json") {
			t.Errorf("%s: limits %v, %v; want one: %v", list, limits, err, want)
		}
	}
}
