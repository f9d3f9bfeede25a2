package gpushare_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// "permanent" is optional: written only when true, so values without it (an
// older plugin's, or every healthy GPU's) keep their exact encoding, and
// readers that do not know it ignore it.
func TestNodeGPUsPermanent(t *testing.T) {
	n := gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, UUID: "GPU-0", Model: "m", Units: 79, Reason: "critical Xid 79 (permanent)", Permanent: true},
		{Index: 1, UUID: "GPU-1", Model: "m", Units: 79, Reason: "critical Xid 62"},
	}}
	got, err := gpushare.EncodeNodeGPUs(n)
	want := `{"unit":"GiB","simulated":false,"gpus":[` +
		`{"index":0,"uuid":"GPU-0","model":"m","units":79,"healthy":false,"reason":"critical Xid 79 (permanent)","permanent":true},` +
		`{"index":1,"uuid":"GPU-1","model":"m","units":79,"healthy":false,"reason":"critical Xid 62"}]}`
	if err != nil || got != want {
		t.Fatalf("EncodeNodeGPUs =\n%s, %v\nwant\n%s", got, err, want)
	}
	back, err := gpushare.DecodeNodeGPUs(got)
	if err != nil || !reflect.DeepEqual(back, n) {
		t.Errorf("DecodeNodeGPUs = %+v, %v; want %+v", back, err, n)
	}
	// An older reader's view of the same value: the field is simply unknown.
	var old struct {
		GPUs []struct {
			Index   int    `json:"index"`
			Healthy bool   `json:"healthy"`
			Reason  string `json:"reason"`
		} `json:"gpus"`
	}
	if err := olderReaderDecode(got, &old); err != nil || len(old.GPUs) != 2 || old.GPUs[0].Healthy {
		t.Errorf("an older reader reads %+v, %v", old, err)
	}
}

// olderReaderDecode decodes as an older reader does: unknown fields ignored.
func olderReaderDecode(s string, v any) error { return json.Unmarshal([]byte(s), v) }
