package store_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/dra/store"
)

func newStore(t *testing.T) (*store.Store, string, string) {
	t.Helper()
	data, cdi := filepath.Join(t.TempDir(), "data"), filepath.Join(t.TempDir(), "cdi")
	s, err := store.New(data, cdi)
	if err != nil {
		t.Fatal(err)
	}
	return s, data, cdi
}

// onlyFiles fails unless dir holds exactly names: no temporary file is left.
func onlyFiles(t *testing.T, dir string, names ...string) {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	if strings.Join(got, ",") != strings.Join(names, ",") {
		t.Errorf("%s holds %v, want %v", dir, got, names)
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	s, data, _ := newStore(t)
	got, err := s.Load()
	if err != nil || len(got) != 0 {
		t.Fatalf("Load without a checkpoint = %v, %v; want empty", got, err)
	}
	share := types.UID("s1")
	want := map[types.UID]store.Claim{"uid-1": {Namespace: "ns", Name: "c", CDIDevices: []string{"gpu-mem.gpushare.io/claim=uid-1"},
		Shares: []prepare.Share{{Request: "gpu", Pool: "n", Device: "gpu-0", ShareID: &share, Units: 4}},
		Spec:   cdispec.Spec{Version: "0.5.0", Kind: "gpu-mem.gpushare.io/claim", Devices: []cdispec.Device{{Name: "uid-1"}}}}}
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	got, err = s.Load()
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("Load = %+v, %v; want %+v", got, err, want)
	}
	onlyFiles(t, data, store.CheckpointFile)
	if fi, err := os.Stat(s.CheckpointPath()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("checkpoint mode %v, %v; want 0600", fi.Mode(), err)
	}
}

func TestCheckpointRefusesWhatItCannotRead(t *testing.T) {
	for name, content := range map[string]string{
		"torn":          `{"version":1,"claims":{"a":`,
		"other version": `{"version":2,"claims":{}}`,
	} {
		s, _, _ := newStore(t)
		if err := os.WriteFile(s.CheckpointPath(), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Load(); err == nil || !strings.Contains(err.Error(), s.CheckpointPath()) {
			t.Errorf("%s: Load error %v, want one naming the file", name, err)
		}
	}
}

func TestSpecWriteAndRemove(t *testing.T) {
	s, _, cdi := newStore(t)
	spec := cdispec.Spec{Version: "0.5.0", Kind: "gpu-mem.gpushare.io/claim", Devices: []cdispec.Device{{Name: "uid-1",
		ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1"}}}}}
	for range 2 { // writing again replaces
		if err := s.WriteSpec("uid-1", spec); err != nil {
			t.Fatal(err)
		}
	}
	path := s.SpecPath("uid-1")
	if filepath.Base(path) != "gpu-mem.gpushare.io-claim_uid-1.json" {
		t.Errorf("spec file %s", path)
	}
	onlyFiles(t, cdi, filepath.Base(path))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var back cdispec.Spec
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, spec) {
		t.Errorf("spec read back %+v, %v", back, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o644 {
		t.Errorf("spec mode %v, want 0644", fi.Mode())
	}
	for range 2 { // removing again is fine
		if err := s.RemoveSpec("uid-1"); err != nil {
			t.Fatal(err)
		}
	}
	onlyFiles(t, cdi)
}

func TestNewRefusesRelativeDirs(t *testing.T) {
	for _, dirs := range [][2]string{{"", "/tmp"}, {"rel", "/tmp"}, {"/tmp", "/tmp/../x"}} {
		if _, err := store.New(dirs[0], dirs[1]); err == nil {
			t.Errorf("New(%q, %q) accepted", dirs[0], dirs[1])
		}
	}
}
