package server_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/server"
)

// readSpec reads the limits specification at path and returns each device as
// "<name> <env...>", after checking what every CDI reader checks.
func readSpec(t testing.TB, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var spec gpushare.CDISpec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if spec.Version != "0.3.0" || spec.Kind != "gpushare.io/limits" {
		t.Errorf("%s: cdiVersion %q kind %q; want 0.3.0 gpushare.io/limits", path, spec.Version, spec.Kind)
	}
	var out []string
	for _, d := range spec.Devices {
		// CDI 0.3.0 device names: a letter first, then letters, digits, -, _, ., :, ending alphanumeric.
		for i, c := range d.Name {
			letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
			alnum := letter || c >= '0' && c <= '9'
			if (i == 0 && !letter) || (i == len(d.Name)-1 && !alnum) || !alnum && !strings.ContainsRune("-_.:", c) {
				t.Errorf("%s: device name %q is not a CDI 0.3.0 name", path, d.Name)
				break
			}
		}
		if len(d.ContainerEdits.Env) == 0 {
			t.Errorf("%s: device %s has no edits", path, d.Name)
		}
		for _, e := range d.ContainerEdits.Env {
			if strings.IndexByte(e, '=') <= 0 {
				t.Errorf("%s: device %s: env edit %q is not NAME=value", path, d.Name, e)
			}
		}
		out = append(out, strings.Join(append([]string{d.Name}, d.ContainerEdits.Env...), " "))
	}
	return out
}

func newLimitSpecs(t testing.TB, cfg server.LimitSpecsConfig) *server.LimitSpecs {
	t.Helper()
	s, err := server.NewLimitSpecs(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// limitsDevice is the device a tier's variables make.
func limitsDevice(tier gpushare.Isolation, envs map[string]string) (string, []string) {
	edits := gpushare.CDILimitsEnv(envs)
	return gpushare.CDILimitsDeviceName(tier, edits), edits
}

// The specification is written atomically into the directory (created), 0644,
// with no temporary file left; a device already there is not written again,
// and a file removed or replaced behind the plugin's back is written again.
func TestLimitSpecsEnsure(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "cdi")
	s := newLimitSpecs(t, server.LimitSpecsConfig{Dir: dir})
	if s.Path() != filepath.Join(dir, "gpushare.io-limits.json") {
		t.Errorf("path %s", s.Path())
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("NewLimitSpecs wrote %s before any device: %v", dir, err)
	}
	a, aEnv := limitsDevice(gpushare.IsolationHAMiCore, map[string]string{"CUDA_DEVICE_MEMORY_LIMIT": "4096m", "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/usr/local/vgpu/gpushare/cudevshr.cache"})
	if err := s.Ensure(a, aEnv); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode().Perm() != 0o644 {
		t.Errorf("specification mode %v; want 0644", info.Mode().Perm())
	}
	if got, want := readSpec(t, s.Path()), []string{a + " " + strings.Join(aEnv, " ")}; !slices.Equal(got, want) {
		t.Errorf("specification %q; want %q", got, want)
	}
	if err := s.Ensure(a, aEnv); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.Stat(s.Path()); !os.SameFile(info, again) {
		t.Error("a device already there was written again")
	}
	if err := s.Ensure(a, []string{"CUDA_DEVICE_MEMORY_LIMIT=1m"}); err == nil {
		t.Error("one name with other edits accepted")
	}

	b, bEnv := limitsDevice(gpushare.IsolationMPS, map[string]string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M", "CUDA_VISIBLE_DEVICES": "GPU-1"})
	if err := s.Ensure(b, bEnv); err != nil {
		t.Fatal(err)
	}
	if got := readSpec(t, s.Path()); len(got) != 2 {
		t.Errorf("specification %q; want both devices", got)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("%s holds %v; want the specification alone", dir, entries)
	}

	if err := os.Remove(s.Path()); err != nil {
		t.Fatal(err)
	}
	if err := s.Ensure(a, aEnv); err != nil {
		t.Fatal(err)
	}
	if got := readSpec(t, s.Path()); len(got) != 2 {
		t.Errorf("after removal, specification %q; want both devices again", got)
	}
	if err := os.WriteFile(s.Path(), []byte(`{"cdiVersion":"0.3.0","kind":"gpushare.io/limits","devices":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Ensure(b, bEnv); err != nil {
		t.Fatal(err)
	}
	if got := readSpec(t, s.Path()); len(got) != 2 {
		t.Errorf("after replacement, specification %q; want both devices again", got)
	}
}

// A restarted plugin keeps the devices it finds (running containers name
// them), but not one whose edits do not match its name; an unreadable file is
// replaced at the next write.
func TestLimitSpecsReadBack(t *testing.T) {
	dir := t.TempDir()
	s := newLimitSpecs(t, server.LimitSpecsConfig{Dir: dir})
	a, aEnv := limitsDevice(gpushare.IsolationHAMiCore, map[string]string{"CUDA_DEVICE_MEMORY_LIMIT": "4096m"})
	b, bEnv := limitsDevice(gpushare.IsolationMPS, map[string]string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8192M"})
	for name, env := range map[string][]string{a: aEnv, b: bEnv} {
		if err := s.Ensure(name, env); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	// Lift b's limit in the file: b is dropped when read back.
	tampered := strings.Replace(string(data), "0=8192M", "0=819200M", 1)
	if err := os.WriteFile(s.Path(), []byte(tampered), 0o644); err != nil {
		t.Fatal(err)
	}
	s2 := newLimitSpecs(t, server.LimitSpecsConfig{Dir: dir})
	if got := s2.Devices(); !slices.Equal(got, []string{a}) {
		t.Errorf("read back %v; want [%s]", got, a)
	}

	if err := os.WriteFile(s.Path(), []byte("{not json"), 0o644); err != nil {
		t.Fatal(err)
	}
	s3 := newLimitSpecs(t, server.LimitSpecsConfig{Dir: dir})
	if got := s3.Devices(); len(got) != 0 {
		t.Errorf("read back %v from a broken file", got)
	}
	if err := s3.Ensure(b, bEnv); err != nil {
		t.Fatal(err)
	}
	if got := readSpec(t, s.Path()); !slices.Equal(got, []string{b + " " + strings.Join(bEnv, " ")}) {
		t.Errorf("specification %q after replacing a broken one", got)
	}
}

// writeCheckpoint writes a kubelet device-manager checkpoint whose entries
// carry the given answers.
func writeCheckpoint(t testing.TB, path string, answers ...*pluginapi.ContainerAllocateResponse) {
	t.Helper()
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           map[int64][]string
		AllocResp                           []byte
	}
	var f struct {
		Data struct {
			PodDeviceEntries  []entry
			RegisteredDevices map[string][]string
		}
		Checksum uint64
	}
	for i, a := range answers {
		raw, err := proto.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		f.Data.PodDeviceEntries = append(f.Data.PodDeviceEntries, entry{PodUID: fmt.Sprint("uid-", i), ContainerName: "main",
			ResourceName: string(gpushare.ResourceName), DeviceIDs: map[int64][]string{-1: {"0-0"}}, AllocResp: raw})
	}
	data, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// A write prunes the devices answered more than the grace ago that no
// answer in the kubelet's checkpoint names (by CDIDevices or by annotation);
// without a readable checkpoint it prunes nothing.
func TestLimitSpecsPrune(t *testing.T) {
	dir := t.TempDir()
	checkpoint := filepath.Join(dir, "kubelet_internal_checkpoint")
	now := time.Unix(1_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	s := newLimitSpecs(t, server.LimitSpecsConfig{Dir: filepath.Join(dir, "cdi"), Checkpoint: checkpoint, Grace: time.Minute, Now: clock})
	dev := func(limit string) (string, []string) {
		return limitsDevice(gpushare.IsolationHAMiCore, map[string]string{"CUDA_DEVICE_MEMORY_LIMIT": limit})
	}
	byCRI, byCRIEnv := dev("1m")
	byAnn, byAnnEnv := dev("2m")
	unnamed, unnamedEnv := dev("3m")
	recent, recentEnv := dev("4m")
	for _, d := range []struct {
		name string
		env  []string
	}{{byCRI, byCRIEnv}, {byAnn, byAnnEnv}, {unnamed, unnamedEnv}} {
		if err := s.Ensure(d.name, d.env); err != nil {
			t.Fatal(err)
		}
	}
	advance(30 * time.Second)
	if err := s.Ensure(recent, recentEnv); err != nil {
		t.Fatal(err)
	}
	advance(45 * time.Second) // the first three are past the grace, recent is not

	// No checkpoint: nothing pruned.
	late, lateEnv := dev("5m")
	if err := s.Ensure(late, lateEnv); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Devices()); got != 5 {
		t.Errorf("%d devices without a checkpoint; want all 5", got)
	}

	writeCheckpoint(t, checkpoint,
		&pluginapi.ContainerAllocateResponse{CdiDevices: []*pluginapi.CDIDevice{{Name: "nvidia.com/gpu=GPU-1"}, {Name: "gpushare.io/limits=" + byCRI}}},
		&pluginapi.ContainerAllocateResponse{Annotations: map[string]string{
			"cdi.k8s.io/gpushare-device-plugin_limits": "gpushare.io/limits=" + byAnn,
			"cdi.k8s.io/gpushare-device-plugin_0":      "nvidia.com/gpu=0"}},
		&pluginapi.ContainerAllocateResponse{Envs: map[string]string{"X": "gpushare.io/limits=" + unnamed}})
	latest, latestEnv := dev("6m")
	if err := s.Ensure(latest, latestEnv); err != nil {
		t.Fatal(err)
	}
	want := []string{byCRI, byAnn, recent, late, latest}
	slices.Sort(want)
	if got := s.Devices(); !slices.Equal(got, want) {
		t.Errorf("devices %v; want %v (%s pruned)", got, want, unnamed)
	}
	if got := len(readSpec(t, s.Path())); got != len(want) {
		t.Errorf("the specification holds %d devices; want %d", got, len(want))
	}

	// A device answered again is not stale, named or not.
	advance(2 * time.Minute)
	if err := s.Ensure(late, lateEnv); err != nil {
		t.Fatal(err)
	}
	another, anotherEnv := dev("7m")
	if err := s.Ensure(another, anotherEnv); err != nil {
		t.Fatal(err)
	}
	want = []string{byCRI, byAnn, late, another}
	slices.Sort(want)
	if got := s.Devices(); !slices.Equal(got, want) {
		t.Errorf("devices %v; want %v", got, want)
	}

	// An unreadable checkpoint prunes nothing.
	if err := os.WriteFile(checkpoint, []byte("{broken"), 0o600); err != nil {
		t.Fatal(err)
	}
	advance(2 * time.Minute)
	last, lastEnv := dev("8m")
	if err := s.Ensure(last, lastEnv); err != nil {
		t.Fatal(err)
	}
	if got := len(s.Devices()); got != len(want)+1 {
		t.Errorf("%d devices after a broken checkpoint; want %d", got, len(want)+1)
	}
}

// A specification that cannot be written fails the answer, and leaves the
// set as it was; a later write that succeeds does not carry the failed device.
func TestLimitSpecsWriteFailsClosed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	s := newLimitSpecs(t, server.LimitSpecsConfig{Dir: dir})
	if err := os.WriteFile(dir, nil, 0o644); err != nil { // a file where the directory goes: not even root writes there
		t.Fatal(err)
	}
	env := gpushare.ContainerEnv{GPUIndex: 0, PodUnits: 4, ContainerUnits: 4, DevUnits: 80, Isolation: gpushare.IsolationHAMiCore}
	tier, err := isolation.For(isolation.Config{HAMiLibrary: "/l", HAMiPreload: "/p", HAMiLockDir: "/k"},
		isolation.Request{Env: env, UUIDs: []string{"GPU-1"}, Unit: gpushare.GiB, CacheDir: "/c/c-1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, list := range []string{"cdi-cri", "cdi-annotations"} {
		d := server.DeviceList{Strategies: strategies(t, list), Limits: s}
		resp, err := d.ContainerResponseWith(env, []string{"GPU-1"}, tier)
		if err == nil || !strings.Contains(err.Error(), "cannot reach the runtime as CDI device gpushare.io/limits=hami-core-") {
			t.Errorf("%s: answer %v, %v; want refused, naming the device", list, resp, err)
		}
		d.Limits = nil
		if resp, err := d.ContainerResponseWith(env, []string{"GPU-1"}, tier); err == nil || !strings.Contains(err.Error(), "no CDI spec directory") {
			t.Errorf("%s without a specification: answer %v, %v; want refused", list, resp, err)
		}
	}
	if got := s.Devices(); len(got) != 0 {
		t.Errorf("devices %v after failed writes", got)
	}
	// The strategies that cannot carry edits need no specification.
	for _, list := range []string{"envvar", "volume-mounts"} {
		d := server.DeviceList{Strategies: strategies(t, list)}
		if _, err := d.ContainerResponseWith(env, []string{"GPU-1"}, tier); err != nil {
			t.Errorf("%s: %v", list, err)
		}
	}
}

// Concurrent answers of several signatures all end up in the specification.
func TestLimitSpecsConcurrent(t *testing.T) {
	s := newLimitSpecs(t, server.LimitSpecsConfig{Dir: t.TempDir()})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Go(func() {
			name, env := limitsDevice(gpushare.IsolationHAMiCore, map[string]string{"CUDA_DEVICE_MEMORY_LIMIT": fmt.Sprint(i%16+1, "m")})
			errs <- s.Ensure(name, env)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := len(readSpec(t, s.Path())); got != 16 {
		t.Errorf("%d devices in the specification; want 16", got)
	}
}

func TestNewLimitSpecsRefusesARelativeDir(t *testing.T) {
	for _, dir := range []string{"", "cdi", "/var/run/../cdi", "/var/run/cdi/"} {
		if _, err := server.NewLimitSpecs(server.LimitSpecsConfig{Dir: dir}); err == nil {
			t.Errorf("dir %q accepted", dir)
		}
	}
}
