package gpushare_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

const usageSample = `{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,"gpus":[{"index":0,"usedMiB":9216,"utilization":40,"unattributedMiB":512}],` +
	`"containers":[{"namespace":"ml","pod":"infer","container":"main","gpu":0,"usedMiB":8704,"sliceMiB":8192}]}`

func TestNodeUsageRoundTrip(t *testing.T) {
	u, err := gpushare.DecodeNodeUsage(usageSample)
	if err != nil {
		t.Fatal(err)
	}
	if !u.Containers[0].Over() || u.GPUs[0].Utilization == nil || *u.GPUs[0].Utilization != 40 {
		t.Errorf("decoded %+v", u)
	}
	enc, err := gpushare.EncodeNodeUsage(u)
	if err != nil || enc != usageSample {
		t.Errorf("encode = %s, %v; want the sample back", enc, err)
	}
	// Encode sorts and drops sub-second time, so equal readings write equal bytes.
	shuffled := gpushare.NodeUsage{At: time.Date(2026, 12, 5, 14, 0, 0, 0, time.FixedZone("CET", 3600)).Add(400 * time.Millisecond), IntervalSeconds: 10,
		GPUs: []gpushare.GPUUsage{{Index: 1}, {Index: 0, UsedMiB: 9216, UnattributedMiB: 512}},
		Containers: []gpushare.ContainerUsage{
			{Namespace: "ml", Pod: "b", Container: "main", GPU: 1},
			{Namespace: "ml", Pod: "a", Container: "main", GPU: 0, UsedMiB: 1},
		}}
	enc, err = gpushare.EncodeNodeUsage(shuffled)
	want := `{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,"gpus":[{"index":0,"usedMiB":9216,"unattributedMiB":512},{"index":1,"usedMiB":0}],` +
		`"containers":[{"namespace":"ml","pod":"a","container":"main","gpu":0,"usedMiB":1,"sliceMiB":0},{"namespace":"ml","pod":"b","container":"main","gpu":1,"usedMiB":0,"sliceMiB":0}]}`
	if err != nil || enc != want {
		t.Errorf("encode = %s, %v\nwant %s", enc, err, want)
	}
	if shuffled.GPUs[0].Index != 1 {
		t.Error("EncodeNodeUsage sorted the caller's slice")
	}
}

func TestNodeUsageInvalid(t *testing.T) {
	gpu0 := `"gpus":[{"index":0,"usedMiB":1}]`
	tests := []struct{ value, field string }{
		{`nope`, "not valid JSON"},
		{`{"intervalSeconds":10,"gpus":[]}`, "at"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":0}`, "intervalSeconds"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,"gpus":[{"index":64}]}`, "gpus[0].index"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,"gpus":[{"index":0},{"index":0}]}`, "gpus[1].index"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,"gpus":[{"index":0,"utilization":101}]}`, "gpus[0].utilization"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,"gpus":[{"index":0,"usedMiB":99999999999}]}`, "gpus[0]"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,` + gpu0 + `,"containers":[{"namespace":"ml","pod":"a","container":"main","gpu":1}]}`, "containers[0].gpu"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,` + gpu0 + `,"containers":[{"namespace":"ML","pod":"a","container":"main","gpu":0}]}`, "containers[0]"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,` + gpu0 + `,"containers":[{"namespace":"ml","pod":"a","container":"main","gpu":0},` +
			`{"namespace":"ml","pod":"a","container":"main","gpu":0}]}`, "containers[1]"},
		{`{"at":"2026-12-05T13:00:00Z","intervalSeconds":10,"truncated":-1}`, "negative"},
	}
	for _, tt := range tests {
		_, err := gpushare.DecodeNodeUsage(tt.value)
		if !errors.Is(err, gpushare.ErrInvalidNodeUsage) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("DecodeNodeUsage(%s) = %v; want ErrInvalidNodeUsage naming %q", tt.value, err, tt.field)
		}
	}
	many := gpushare.NodeUsage{At: time.Now(), IntervalSeconds: 1, GPUs: []gpushare.GPUUsage{{Index: 0}}}
	for i := range gpushare.MaxUsageContainers + 1 {
		many.Containers = append(many.Containers, gpushare.ContainerUsage{Namespace: "n", Pod: "p" + strings.Repeat("x", i%50) + string(rune('a'+i%26)) + string(rune('a'+i/26)), Container: "c"})
	}
	if _, err := gpushare.EncodeNodeUsage(many); !errors.Is(err, gpushare.ErrInvalidNodeUsage) {
		t.Errorf("%d containers encoded: %v", len(many.Containers), err)
	}
}

func FuzzDecodeNodeUsage(f *testing.F) {
	for _, s := range []string{usageSample, `{}`, `null`, `{"at":"2026-12-05T13:00:00Z","intervalSeconds":1,"gpus":[{"index":3,"utilization":-1}]}`,
		`{"at":"2026-12-05T13:00:00.999+01:00","intervalSeconds":1,"gpus":[{"index":0}],"containers":[{"namespace":"a","pod":"b.c","container":"d","gpu":0}],"truncated":2}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := gpushare.DecodeNodeUsage(s)
		if err != nil {
			if !errors.Is(err, gpushare.ErrInvalidNodeUsage) {
				t.Fatalf("DecodeNodeUsage(%q) error %v is not ErrInvalidNodeUsage", s, err)
			}
			return
		}
		enc, err := gpushare.EncodeNodeUsage(u)
		if err != nil {
			t.Fatalf("EncodeNodeUsage(%+v) of a decoded value: %v", u, err)
		}
		again, err := gpushare.DecodeNodeUsage(enc)
		if err != nil || !reflect.DeepEqual(again, u) {
			t.Fatalf("round trip %q → %q → %+v, %v; want %+v", s, enc, again, err, u)
		}
	})
}
