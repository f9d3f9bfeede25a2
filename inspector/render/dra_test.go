package render_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/internal/fixture"
	"github.com/gpushare/gpushare/inspector/render"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// draCluster is fixture.DRACluster's report: a DRA node of 8 H100s and a
// device-plugin node in one cluster.
func draCluster() *collect.Report {
	nodes, pods, slices, claims := fixture.DRACluster()
	return collect.BuildObjects(collect.Objects{Nodes: nodes, Pods: pods, Slices: slices, Claims: claims})
}

// TestDRAGolden keeps its own goldens (dra-*), so -update with -run
// TestDRAGolden writes only them.
func TestDRAGolden(t *testing.T) {
	cases := []struct {
		golden string
		render func(w *bytes.Buffer, r *collect.Report) error
	}{
		{"dra-summary.txt", func(w *bytes.Buffer, r *collect.Report) error { return render.Summary(w, r) }},
		{"dra-details.txt", func(w *bytes.Buffer, r *collect.Report) error { return render.Details(w, r) }},
		{"dra.json", func(w *bytes.Buffer, r *collect.Report) error { return render.JSON(w, r) }},
	}
	for _, tc := range cases {
		t.Run(tc.golden, func(t *testing.T) {
			var got bytes.Buffer
			if err := tc.render(&got, draCluster()); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.golden)
			if *update {
				if err := os.WriteFile(path, got.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestDRAGolden -update to create it)", err)
			}
			if !bytes.Equal(got.Bytes(), want) {
				t.Errorf("output differs from %s\n--- got ---\n%s\n--- want ---\n%s", path, got.String(), want)
			}
		})
	}
}

// -d marks the DRA node and names each claim with its memory, GPUs, and
// the pods and containers using it; a shared claim lists both pods, an
// unused one "-".
func TestDRADetails(t *testing.T) {
	var b bytes.Buffer
	if err := render.Details(&b, draCluster()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"IPADDRESS:  10.7.0.1\nMODE:       dra (gpu-mem.gpushare.io)\nUNHEALTHY:  GPU5 (fatal-xid-48, NoSchedule)\nISOLATION:  none\n",
		"ml/cache          8            3    ml/reader-a (main), ml/reader-b (main)\n",
		"ml/orphan         4            6    -\n",
		"ml/train-gpu      32 (16/GPU)  1,2  ml/train (warmup, main)\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("details:\n%s\nwant\n%q", b.String(), want)
		}
	}
}

// A DRA node added to a cluster leaves the device-plugin nodes' -d blocks
// byte for byte as they were (a DRA node sorting after them; the first
// node's rows set the dash line, as in the old CLI), and adds its row to
// the same summary table.
func TestDRANodeLeavesDevicePluginNodes(t *testing.T) {
	nodes, pods := richCluster()
	var before bytes.Buffer
	if err := render.Details(&before, collect.Build(nodes, pods)); err != nil {
		t.Fatal(err)
	}
	p := fixture.ClaimPod("ml", "dra-pod", "zz-dra", "c")
	objects := collect.Objects{
		Nodes:  append(nodes, fixture.Node("zz-dra", "10.8.0.1", 0, 0)),
		Pods:   append(pods, p),
		Slices: []resourceapi.ResourceSlice{fixture.Slice("zz-dra", gpushare.GiB, fixture.H100(0))},
		Claims: []resourceapi.ResourceClaim{fixture.Claim("ml", "c", "zz-dra", gpushare.GiB, []fixture.ClaimShare{{GPU: 0, Units: 20}}, p)},
	}
	r := collect.BuildObjects(objects)
	var after bytes.Buffer
	if err := render.Details(&after, r); err != nil {
		t.Fatal(err)
	}
	blocks := before.String()[:strings.LastIndex(before.String(), "\n\n\nAllocated/Total")]
	if !strings.HasPrefix(after.String(), blocks) {
		t.Errorf("device-plugin blocks changed:\n%s\nwas\n%s", after.String(), before.String())
	}
	var summary bytes.Buffer
	if err := render.Summary(&summary, r); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(summary.String(), "\nzz-dra     10.8.0.1   20/79 ") || !strings.Contains(summary.String(), "\n44/155 (28%)") {
		t.Errorf("summary:\n%s", summary.String())
	}
}

// JSON names each claim: per node with its pods, per pod with its UID and
// share IDs, per container by name; the node says its mode. Device-plugin
// nodes carry neither field.
func TestDRAJSON(t *testing.T) {
	var b bytes.Buffer
	if err := render.JSON(&b, draCluster()); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Nodes []struct {
			Name   string           `json:"name"`
			Mode   *string          `json:"mode"`
			Claims []map[string]any `json:"claims"`
			Pods   []struct {
				Name   string `json:"name"`
				Claims []struct {
					Name   string `json:"name"`
					UID    string `json:"uid"`
					Shares []struct {
						ShareID string `json:"shareID"`
					} `json:"shares"`
				} `json:"claims"`
				Containers []struct {
					Claims []string `json:"claims"`
				} `json:"containers"`
			} `json:"pods"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	dp, dra := doc.Nodes[0], doc.Nodes[1]
	if dp.Name != "dp-0" || dp.Mode != nil || dp.Claims != nil || strings.Contains(b.String(), `"claims": null`) {
		t.Errorf("device-plugin node has DRA fields: %+v", dp)
	}
	if dra.Mode == nil || *dra.Mode != "dra" || len(dra.Claims) != 6 {
		t.Fatalf("DRA node %+v", dra)
	}
	cache := dra.Claims[2]
	if cache["name"] != "cache" || cache["uid"] != "uid-cache" || len(cache["pods"].([]any)) != 2 {
		t.Errorf("shared claim %v", cache)
	}
	reader := dra.Pods[3]
	if reader.Name != "reader-a" || reader.Claims[0].Name != "cache" || reader.Claims[0].UID != "uid-cache" ||
		reader.Claims[0].Shares[0].ShareID != "share-cache-0" || reader.Containers[0].Claims[0] != "cache" {
		t.Errorf("pod %+v", reader)
	}
}
