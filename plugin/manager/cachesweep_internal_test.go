package manager

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestStaleCacheDirs(t *testing.T) {
	const root = "/var/lib/gpushare/hami-cache"
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	old, young := now.Add(-cacheGrace), now.Add(-cacheGrace+time.Second)
	for _, tc := range []struct {
		name    string
		entries []cacheEntry
		mounted []string
		want    []string
	}{
		{"nothing there", nil, nil, nil},
		{"old and unmounted", []cacheEntry{{"c-123", true, old}}, nil, []string{"c-123"}},
		{"old but mounted", []cacheEntry{{"c-123", true, old}}, []string{root + "/c-123"}, nil},
		{"mounted elsewhere only", []cacheEntry{{"c-123", true, old}}, []string{"/elsewhere/c-123"}, []string{"c-123"}},
		{"young", []cacheEntry{{"c-123", true, young}}, nil, nil},
		{"in the future", []cacheEntry{{"c-123", true, now.Add(time.Hour)}}, nil, nil},
		{"a symlink or file", []cacheEntry{{"c-123", false, old}}, nil, nil},
		{"not our name", []cacheEntry{{"keep", true, old}, {"c-", true, old}, {"c-12a", true, old}, {"c-12345678901", true, old}, {"x-1", true, old}}, nil, nil},
		{"several", []cacheEntry{{"c-1", true, old}, {"c-2", true, old}, {"c-3", true, young}, {"c-4294967295", true, old}},
			[]string{root + "/c-2"}, []string{"c-1", "c-4294967295"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mounted := map[string]bool{}
			for _, p := range tc.mounted {
				mounted[p] = true
			}
			if got := staleCacheDirs(root, tc.entries, mounted, now, cacheGrace); !slices.Equal(got, tc.want) {
				t.Errorf("staleCacheDirs = %v; want %v", got, tc.want)
			}
		})
	}
}

// writeCheckpoint writes a kubelet device-manager checkpoint whose one
// container was answered with mounts of hostPaths.
func writeCheckpoint(t *testing.T, path string, hostPaths ...string) {
	t.Helper()
	resp := &pluginapi.ContainerAllocateResponse{}
	for _, p := range hostPaths {
		resp.Mounts = append(resp.Mounts, &pluginapi.Mount{ContainerPath: "/usr/local/vgpu/gpushare", HostPath: p})
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           map[string][]string
		AllocResp                           []byte
	}
	cp := map[string]any{
		"Data": map[string]any{
			"PodDeviceEntries":  []entry{{"uid", "c", "gpushare.io/gpu-memory", map[string][]string{"-1": {"d"}}, b}},
			"RegisteredDevices": map[string][]string{"gpushare.io/gpu-memory": {"d"}},
		},
		"Checksum": 1,
	}
	data, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestSweepCacheDirs(t *testing.T) {
	now := time.Now().Add(time.Hour)
	setup := func(t *testing.T) (root, checkpoint string) {
		dir := t.TempDir()
		root, checkpoint = filepath.Join(dir, "cache"), filepath.Join(dir, checkpointFile)
		outside := filepath.Join(dir, "outside")
		for _, d := range []string{root, outside, filepath.Join(root, "c-1"), filepath.Join(root, "c-2"), filepath.Join(root, "c-3"), filepath.Join(root, "keep")} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(root, "c-3", "cudevshr.cache"), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(outside, filepath.Join(root, "c-4")); err != nil {
			t.Fatal(err)
		}
		// The sweep runs an hour from now: everything is old but c-2.
		if err := os.Chtimes(filepath.Join(root, "c-2"), now, now); err != nil {
			t.Fatal(err)
		}
		// c-1 is old and mounted, c-2 young, c-3 old and unmounted, keep not
		// ours, c-4 a symlink to a directory outside the root.
		return root, checkpoint
	}
	list := func(t *testing.T, root string) []string {
		des, err := os.ReadDir(root)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, de := range des {
			names = append(names, de.Name())
		}
		return names
	}
	all := []string{"c-1", "c-2", "c-3", "c-4", "keep"}

	t.Run("only the old unmounted one goes", func(t *testing.T) {
		root, checkpoint := setup(t)
		writeCheckpoint(t, checkpoint, filepath.Join(root, "c-1"), "/tmp/vgpulock")
		n, err := sweepCacheDirs(root, checkpoint, now, cacheGrace)
		if err != nil || n != 1 {
			t.Errorf("sweepCacheDirs = %d, %v; want 1, nil", n, err)
		}
		if got, want := list(t, root), []string{"c-1", "c-2", "c-4", "keep"}; !slices.Equal(got, want) {
			t.Errorf("left %v; want %v", got, want)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(root), "outside")); err != nil {
			t.Errorf("the symlink's target: %v", err)
		}
	})
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, checkpoint string)
	}{
		{"no checkpoint", func(*testing.T, string) {}},
		{"unreadable checkpoint", func(t *testing.T, cp string) {
			if err := os.Mkdir(cp, 0o755); err != nil { // reading a directory fails, as root too
				t.Fatal(err)
			}
		}},
		{"not JSON", func(t *testing.T, cp string) {
			if err := os.WriteFile(cp, []byte("{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"no Data", func(t *testing.T, cp string) {
			if err := os.WriteFile(cp, []byte("{}"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a broken answer", func(t *testing.T, cp string) {
			if err := os.WriteFile(cp, []byte(`{"Data":{"PodDeviceEntries":[{"AllocResp":"/w=="}]}}`), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name+" removes nothing", func(t *testing.T) {
			root, checkpoint := setup(t)
			tc.write(t, checkpoint)
			n, err := sweepCacheDirs(root, checkpoint, now, cacheGrace)
			if err == nil || n != 0 {
				t.Errorf("sweepCacheDirs = %d, %v; want 0 and an error", n, err)
			}
			if got := list(t, root); !slices.Equal(got, all) {
				t.Errorf("left %v; want %v", got, all)
			}
		})
	}
	t.Run("no root is nothing to do", func(t *testing.T) {
		dir := t.TempDir()
		if n, err := sweepCacheDirs(filepath.Join(dir, "cache"), filepath.Join(dir, checkpointFile), now, cacheGrace); n != 0 || err != nil {
			t.Errorf("sweepCacheDirs = %d, %v; want 0, nil", n, err)
		}
	})
}
