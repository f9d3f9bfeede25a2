package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func writeSpec(t *testing.T, dir, name, data string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestInjectCDI(t *testing.T) {
	base := t.TempDir()
	low, high := filepath.Join(base, "etc"), filepath.Join(base, "run")
	writeSpec(t, low, "gpu.json", `{"cdiVersion":"0.5.0","kind":"example.com/gpu","containerEdits":{"env":["VISIBLE=void"]},
		"devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/x0"}]}},{"name":"1","containerEdits":{"env":["ONE=low"]}}]}`)
	writeSpec(t, high, "gpu.json", `{"cdiVersion":"0.5.0","kind":"example.com/gpu","devices":[{"name":"1","containerEdits":{"env":["ONE=high"]}}]}`)
	writeSpec(t, high, "limits.json", `{"cdiVersion":"0.3.0","kind":"example.com/limits","devices":[{"name":"a","containerEdits":{"env":["LIMIT=1","OTHER=2"]}}]}`)
	writeSpec(t, high, "twice.json", `{"cdiVersion":"0.3.0","kind":"example.com/limits","devices":[{"name":"dup","containerEdits":{"env":["X=1"]}}]}`)
	writeSpec(t, high, "twice2.json", `{"cdiVersion":"0.3.0","kind":"example.com/limits","devices":[{"name":"dup","containerEdits":{"env":["X=2"]}}]}`)
	writeSpec(t, high, "broken.json", `{"cdiVersion":"0.3.0","kind":"example.com/broken","devices":[{"name":"b"`)
	writeSpec(t, high, "limits.json.tmp", `{"cdiVersion":"0.3.0","kind":"example.com/tmp","devices":[{"name":"t","containerEdits":{"env":["T=1"]}}]}`)
	reg := loadCDI([]string{low, high})

	own := effectiveEnv([]keyValue{{"LIMIT", "pod"}, {"A", "1"}, {"LIMIT", "pod2"}, {"VISIBLE", "all"}})
	if want := []keyValue{{"LIMIT", "pod2"}, {"A", "1"}, {"VISIBLE", "all"}}; !slices.Equal(own, want) {
		t.Fatalf("effective own env %v, want %v", own, want)
	}
	devices := requestedCDIDevices(map[string]string{"cdi.k8s.io/p_1": "example.com/gpu=0", "other": "example.com/gpu=9", "cdi.k8s.io/p_0": "example.com/gpu=1,example.com/limits=a"},
		[]string{"example.com/limits=a", "example.com/limits=a"})
	if want := []string{"example.com/limits=a", "example.com/gpu=1", "example.com/gpu=0"}; !slices.Equal(devices, want) {
		t.Fatalf("requested %v, want %v", devices, want)
	}
	got, err := reg.inject(own, devices)
	if err != nil {
		t.Fatal(err)
	}
	// gpu=1 comes from the higher-priority directory, whose spec has no spec-wide edits; gpu=0 from
	// the lower one brings its spec's VISIBLE=void.
	want := []keyValue{{"LIMIT", "1"}, {"A", "1"}, {"VISIBLE", "void"}, {"OTHER", "2"}, {"ONE", "high"}}
	if !slices.Equal(got, want) {
		t.Errorf("injected env %v, want %v", got, want)
	}
	for _, bad := range []string{"example.com/limits=dup", "example.com/broken=b", "example.com/tmp=t", "example.com/limits=zz"} {
		_, err := reg.inject(own, []string{"example.com/limits=a", bad})
		if err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices "+bad) {
			t.Errorf("inject %s: %v, want unresolvable", bad, err)
		}
	}
}
