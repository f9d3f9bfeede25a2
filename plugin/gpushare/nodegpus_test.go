package gpushare_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func h100(index int, units uint64) gpushare.GPUInfo {
	return gpushare.GPUInfo{Index: index, UUID: fmt.Sprintf("GPU-%d", index), Model: "NVIDIA H100 80GB HBM3", Units: units, Healthy: true}
}

func TestEncodeNodeGPUs(t *testing.T) {
	n := gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		h100(1, 79),
		{Index: 0, UUID: "GPU-0", Model: "NVIDIA A10", Units: 22, Healthy: false, Reason: "XID 79"},
	}}
	got, err := gpushare.EncodeNodeGPUs(n)
	want := `{"unit":"GiB","simulated":false,"gpus":[` +
		`{"index":0,"uuid":"GPU-0","model":"NVIDIA A10","units":22,"healthy":false,"reason":"XID 79"},` +
		`{"index":1,"uuid":"GPU-1","model":"NVIDIA H100 80GB HBM3","units":79,"healthy":true,"reason":""}]}`
	if err != nil || got != want {
		t.Fatalf("EncodeNodeGPUs =\n%s, %v\nwant\n%s", got, err, want)
	}
	if n.GPUs[0].Index != 1 {
		t.Error("EncodeNodeGPUs reordered its argument's GPUs")
	}
	if got := n.TotalUnits(); got != 101 {
		t.Errorf("TotalUnits = %d; want 101", got)
	}
	if g, ok := n.GPU(0); !ok || g.Model != "NVIDIA A10" {
		t.Errorf("GPU(0) = %+v, %v", g, ok)
	}
	if _, ok := n.GPU(5); ok {
		t.Error("GPU(5) found on a two-GPU node")
	}
	empty, err := gpushare.EncodeNodeGPUs(gpushare.NodeGPUs{Unit: 256, Simulated: true})
	if err != nil || empty != `{"unit":"256MiB","simulated":true,"gpus":[]}` {
		t.Errorf("EncodeNodeGPUs(no GPUs) = %s, %v", empty, err)
	}
}

func TestNodeGPUsRejects(t *testing.T) {
	many := make([]gpushare.GPUInfo, gpushare.MaxGPUsPerNode+1)
	for i := range many {
		many[i] = h100(i%gpushare.MaxGPUsPerNode, 1)
	}
	tests := []struct {
		name, field string
		n           gpushare.NodeGPUs
	}{
		{"zero unit", "unit", gpushare.NodeGPUs{}},
		{"bad unit", "unit", gpushare.NodeGPUs{Unit: 3}},
		{"too many GPUs", "gpus", gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: many}},
		{"negative index", "gpus[0].index", gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{h100(-1, 1)}}},
		{"index too high", "gpus[0].index", gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{h100(64, 1)}}},
		{"duplicate index", "gpus[1].index", gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{h100(0, 1), h100(0, 2)}}},
		{"zero units", "gpus[0].units", gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{h100(0, 0)}}},
		{"too many units", "gpus[0].units", gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{h100(0, gpushare.MaxUnits+1)}}},
		{"link to an unknown GPU", "links[0]", twoGPUs(gpushare.GPULink{A: 0, B: 2, Score: 10})},
		{"link with a = b", "links[0]", twoGPUs(gpushare.GPULink{A: 1, B: 1, Score: 10})},
		{"link with a > b", "links[0]", twoGPUs(gpushare.GPULink{A: 1, B: 0, Score: 10})},
		{"pair twice", "links[1]", twoGPUs(gpushare.GPULink{A: 0, B: 1, Score: 10}, gpushare.GPULink{A: 0, B: 1, Score: 20})},
		{"negative score", "links[0]", twoGPUs(gpushare.GPULink{A: 0, B: 1, Score: -1})},
		{"negative NVLinks", "links[0]", twoGPUs(gpushare.GPULink{A: 0, B: 1, Score: 10, NVLinks: -2})},
	}
	for _, tt := range tests {
		_, err := gpushare.EncodeNodeGPUs(tt.n)
		var ne *gpushare.NodeGPUsError
		if !errors.Is(err, gpushare.ErrInvalidNodeGPUs) || !errors.As(err, &ne) || ne.Field != tt.field {
			t.Errorf("%s: EncodeNodeGPUs error = %v; want *NodeGPUsError on %s", tt.name, err, tt.field)
		}
	}
}

// twoGPUs is a node of GPUs 0 and 1 with links.
func twoGPUs(links ...gpushare.GPULink) gpushare.NodeGPUs {
	return gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{h100(0, 1), h100(1, 1)}, Links: links}
}

func TestNodeGPUsTopology(t *testing.T) {
	numa0, numa1 := 0, -1
	n := gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{h100(2, 79), h100(0, 79), h100(1, 79)},
		Links: []gpushare.GPULink{{A: 1, B: 2, Score: 20}, {A: 0, B: 2, Score: 1820, NVLinks: 18}, {A: 0, B: 1, Score: 50}}}
	n.GPUs[0].NUMANode, n.GPUs[0].PCIBusID = &numa0, "00000000:1B:00.0"
	n.GPUs[1].NUMANode = &numa1
	enc, err := gpushare.EncodeNodeGPUs(n)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"numa":0,"pciBusId":"00000000:1B:00.0"`, `"numa":-1}`,
		`"links":[{"a":0,"b":1,"score":50},{"a":0,"b":2,"score":1820,"nvlinks":18},{"a":1,"b":2,"score":20}]`} {
		if !strings.Contains(enc, want) {
			t.Errorf("encoded %s\nlacks %s", enc, want)
		}
	}
	got, err := gpushare.DecodeNodeGPUs(enc)
	if err != nil || len(got.Links) != 3 || got.Links[1].NVLinks != 18 || *got.GPUs[2].NUMANode != 0 || got.GPUs[2].PCIBusID != "00000000:1B:00.0" ||
		*got.GPUs[0].NUMANode != -1 || got.GPUs[1].NUMANode != nil {
		t.Errorf("DecodeNodeGPUs = %+v, %v", got, err)
	}
	// No links: the key is omitted, and an empty list decodes as none.
	if enc, _ := gpushare.EncodeNodeGPUs(twoGPUs()); strings.Contains(enc, "links") || strings.Contains(enc, "numa") {
		t.Errorf("without topology: %s", enc)
	}
	if got, err := gpushare.DecodeNodeGPUs(`{"unit":"GiB","gpus":[{"index":0,"units":1}],"links":[]}`); err != nil || got.Links != nil {
		t.Errorf("empty links = %+v, %v", got.Links, err)
	}
}

func TestDecodeNodeGPUs(t *testing.T) {
	in := `{"unit":"GiB","simulated":false,"future":{"x":1},"gpus":[` +
		`{"index":1,"uuid":"GPU-1","model":"NVIDIA H100 80GB HBM3","units":79,"healthy":true,"reason":""},` +
		`{"index":0,"uuid":"GPU-0","model":"NVIDIA H100 80GB HBM3","units":79,"healthy":true}]}`
	got, err := gpushare.DecodeNodeGPUs(in)
	want := gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{h100(0, 79), h100(1, 79)}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("DecodeNodeGPUs = %+v, %v; want %+v", got, err, want)
	}
	got, err = gpushare.DecodeNodeGPUs(`{"unit":"MiB","simulated":true}`)
	if err != nil || got.GPUs == nil || len(got.GPUs) != 0 || !got.Simulated || got.Unit != gpushare.MiB {
		t.Fatalf("DecodeNodeGPUs(no gpus) = %+v, %v; want empty non-nil GPUs", got, err)
	}
}

func TestDecodeNodeGPUsRejects(t *testing.T) {
	gpus65 := strings.Repeat(`{"index":0,"units":1},`, 65)
	for _, in := range []string{
		``, `null`, `[]`, `"x"`, `{`, `{"gpus":[]}`, `{"unit":null,"gpus":[]}`, `{"unit":"3MiB","gpus":[]}`, `{"unit":1,"gpus":[]}`,
		`{"unit":"GiB","gpus":{}}`, `{"unit":"GiB","gpus":[{"index":-1,"units":1}]}`, `{"unit":"GiB","gpus":[{"index":64,"units":1}]}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1},{"index":0,"units":1}]}`, `{"unit":"GiB","gpus":[{"index":0,"units":0}]}`,
		`{"unit":"GiB","gpus":[{"index":0}]}`, `{"unit":"GiB","gpus":[{"index":0,"units":-1}]}`, `{"unit":"GiB","gpus":[{"index":0,"units":1.5}]}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1048577}]}`, `{"unit":"GiB","gpus":[{"index":"0","units":1}]}`,
		`{"unit":"GiB","gpus":[` + gpus65[:len(gpus65)-1] + `]}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1}],"links":[{"a":0,"b":1,"score":10}]}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1},{"index":1,"units":1}],"links":[{"a":1,"b":0,"score":10}]}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1},{"index":1,"units":1}],"links":{}}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1},{"index":1,"units":1}],"links":[{"a":0,"b":1,"score":"x"}]}`,
	} {
		_, err := gpushare.DecodeNodeGPUs(in)
		var ne *gpushare.NodeGPUsError
		if !errors.Is(err, gpushare.ErrInvalidNodeGPUs) || !errors.As(err, &ne) {
			t.Errorf("DecodeNodeGPUs(%.60s) error = %v; want *NodeGPUsError", in, err)
		}
	}
}

func FuzzDecodeNodeGPUs(f *testing.F) {
	for _, s := range []string{
		`{"unit":"GiB","simulated":false,"gpus":[{"index":0,"uuid":"GPU-a","model":"NVIDIA H100 80GB HBM3","units":79,"healthy":true,"reason":""}]}`,
		`{"unit":"256MiB","simulated":true,"gpus":[{"index":1,"units":3},{"index":0,"units":2,"healthy":false,"reason":"XID 48"}]}`,
		`{"unit":"GiB","gpus":[{"index":1,"units":2,"numa":1,"pciBusId":"00000000:9A:00.0"},{"index":0,"units":2,"numa":-1}],` +
			`"links":[{"a":0,"b":1,"score":1820,"nvlinks":18}]}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1},{"index":1,"units":1},{"index":2,"units":1}],"links":[{"a":1,"b":2,"score":20},{"a":0,"b":2,"score":10}]}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1},{"index":1,"units":1}],"links":[]}`,
		`{"unit":"GiB","gpus":[{"index":0,"units":1},{"index":1,"units":1}],"links":[{"a":0,"b":1},{"a":0,"b":1}]}`,
		`{"unit":"MiB"}`, `{"unit":"GiB","gpus":null}`, `{"unit":"GiB","gpus":[{"index":0,"units":1},{"index":0,"units":1}]}`, `null`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := gpushare.DecodeNodeGPUs(s)
		if err != nil {
			if !errors.Is(err, gpushare.ErrInvalidNodeGPUs) {
				t.Fatalf("DecodeNodeGPUs(%q) error %v is not ErrInvalidNodeGPUs", s, err)
			}
			return
		}
		enc, err := gpushare.EncodeNodeGPUs(n)
		if err != nil {
			t.Fatalf("EncodeNodeGPUs(%+v) of a decoded value: %v", n, err)
		}
		again, err := gpushare.DecodeNodeGPUs(enc)
		if err != nil || !reflect.DeepEqual(again, n) {
			t.Fatalf("round trip %q → %q → %+v, %v; want %+v", s, enc, again, err, n)
		}
		if enc2, _ := gpushare.EncodeNodeGPUs(again); enc2 != enc {
			t.Fatalf("encoding not deterministic: %q vs %q", enc, enc2)
		}
	})
}
