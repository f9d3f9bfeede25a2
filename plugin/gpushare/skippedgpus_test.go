package gpushare_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestSkippedGPUsName(t *testing.T) {
	// Running clusters and tools read this exact key.
	if gpushare.AnnotationSkippedGPUs != "gpushare.io/skipped-gpus" {
		t.Errorf("AnnotationSkippedGPUs = %q", gpushare.AnnotationSkippedGPUs)
	}
}

func TestEncodeSkippedGPUs(t *testing.T) {
	in := []gpushare.SkippedGPU{
		{Index: 3, UUID: "GPU-3", Model: "NVIDIA A100-SXM4-40GB", Reason: "MIG mode is enabled"},
		{Index: 1, UUID: "GPU-1", Model: "NVIDIA A100-SXM4-40GB", Reason: "MIG mode is enabled"},
	}
	got, err := gpushare.EncodeSkippedGPUs(in)
	want := `[{"index":1,"uuid":"GPU-1","model":"NVIDIA A100-SXM4-40GB","reason":"MIG mode is enabled"},` +
		`{"index":3,"uuid":"GPU-3","model":"NVIDIA A100-SXM4-40GB","reason":"MIG mode is enabled"}]`
	if err != nil || got != want {
		t.Fatalf("EncodeSkippedGPUs =\n%s, %v\nwant\n%s", got, err, want)
	}
	if in[0].Index != 3 {
		t.Error("EncodeSkippedGPUs reordered its argument")
	}
	if empty, err := gpushare.EncodeSkippedGPUs(nil); err != nil || empty != "[]" {
		t.Errorf("EncodeSkippedGPUs(nil) = %q, %v", empty, err)
	}
	back, err := gpushare.DecodeSkippedGPUs(got)
	if err != nil || !reflect.DeepEqual(back, []gpushare.SkippedGPU{in[1], in[0]}) {
		t.Errorf("DecodeSkippedGPUs(%s) = %+v, %v", got, back, err)
	}
}

func TestDecodeSkippedGPUs(t *testing.T) {
	got, err := gpushare.DecodeSkippedGPUs(`[{"index":2,"reason":"MIG","future":true}]`)
	if err != nil || !reflect.DeepEqual(got, []gpushare.SkippedGPU{{Index: 2, Reason: "MIG"}}) {
		t.Errorf("DecodeSkippedGPUs with an unknown field = %+v, %v", got, err)
	}
	got, err = gpushare.DecodeSkippedGPUs(`[]`)
	if err != nil || got == nil || len(got) != 0 {
		t.Errorf("DecodeSkippedGPUs([]) = %#v, %v; want an empty non-nil list", got, err)
	}
}

func TestSkippedGPUsRejects(t *testing.T) {
	many := `[` + strings.Repeat(`{"index":0},`, 64) + `{"index":0}]`
	for _, in := range []string{
		``, `null`, `{}`, `"x"`, `[`, `[{"index":-1}]`, `[{"index":64}]`, `[{"index":"1"}]`, `[{"index":1.5}]`,
		`[{"index":0},{"index":0}]`, many,
	} {
		_, err := gpushare.DecodeSkippedGPUs(in)
		var se *gpushare.SkippedGPUsError
		if !errors.Is(err, gpushare.ErrInvalidSkippedGPUs) || !errors.As(err, &se) {
			t.Errorf("DecodeSkippedGPUs(%.40q) error = %v; want *SkippedGPUsError", in, err)
		}
	}
	for _, in := range [][]gpushare.SkippedGPU{{{Index: -1}}, {{Index: 64}}, {{Index: 1}, {Index: 1}}, make([]gpushare.SkippedGPU, 65)} {
		if _, err := gpushare.EncodeSkippedGPUs(in); !errors.Is(err, gpushare.ErrInvalidSkippedGPUs) {
			t.Errorf("EncodeSkippedGPUs(%d GPUs) error = %v; want ErrInvalidSkippedGPUs", len(in), err)
		}
	}
	err := gpushare.ValidateSkippedGPUs([]gpushare.SkippedGPU{{Index: 1}, {Index: 1}})
	if err == nil || !strings.Contains(err.Error(), "[1].index: index 1 appears twice") {
		t.Errorf("ValidateSkippedGPUs(duplicate) = %v; want it to name the field", err)
	}
}

func FuzzDecodeSkippedGPUs(f *testing.F) {
	for _, s := range []string{
		`[{"index":1,"uuid":"GPU-1","model":"NVIDIA A100-SXM4-40GB","reason":"MIG mode is enabled"}]`,
		`[{"index":3},{"index":0,"reason":"x"}]`, `[]`, `null`, `[{"index":0},{"index":0}]`, `[{"index":63,"uuid":"\xff"}]`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		gpus, err := gpushare.DecodeSkippedGPUs(s)
		if err != nil {
			if !errors.Is(err, gpushare.ErrInvalidSkippedGPUs) {
				t.Fatalf("DecodeSkippedGPUs(%q) error %v is not ErrInvalidSkippedGPUs", s, err)
			}
			return
		}
		enc, err := gpushare.EncodeSkippedGPUs(gpus)
		if err != nil {
			t.Fatalf("EncodeSkippedGPUs(%+v) of a decoded value: %v", gpus, err)
		}
		again, err := gpushare.DecodeSkippedGPUs(enc)
		if err != nil || !reflect.DeepEqual(again, gpus) {
			t.Fatalf("round trip %q → %q → %+v, %v; want %+v", s, enc, again, err, gpus)
		}
		if enc2, _ := gpushare.EncodeSkippedGPUs(again); enc2 != enc {
			t.Fatalf("encoding not deterministic: %q vs %q", enc, enc2)
		}
	})
}
