package gpushareplugin

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/preempt"
)

func TestDecodeArgs(t *testing.T) {
	for _, tt := range []struct {
		raw     string
		want    Args
		wantErr string
	}{
		{"", Args{Policy: "bestfit"}, ""},
		{`{"policy":"spread","assumeTTL":"45s","bindTimeout":"3s"}`, Args{Policy: "spread", AssumeTTL: metaDuration{45 * time.Second}, BindTimeout: metaDuration{3 * time.Second}}, ""},
		{`{"policy":""}`, Args{Policy: "bestfit"}, ""},
		{`{"polcy":"spread"}`, Args{}, "unknown field"},
		{`{"assumeTTL":30}`, Args{}, "a duration is a string"},
		{`{"assumeTTL":"-1s"}`, Args{}, "negative"},
		{`{"syncTimeout":"soon"}`, Args{}, "invalid duration"},
	} {
		var obj runtime.Object
		if tt.raw != "" {
			obj = &runtime.Unknown{Raw: []byte(tt.raw)}
		}
		got, err := decodeArgs(obj)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want one saying %q", tt.raw, err, tt.wantErr)
			}
		case err != nil || got != tt.want:
			t.Errorf("%s: %+v, %v; want %+v", tt.raw, got, err, tt.want)
		}
	}
}

// A clone's what-ifs are its own: preemption evaluates victims on clones of the cycle state, and
// one node's evaluation must not leak into the state Filter reads for another, or into the
// original.
func TestStateCloneIsolatesWhatIfs(t *testing.T) {
	s := &state{removed: map[string][]preempt.Holder{"n1": {{UID: "a"}}}, added: map[string][]nominated{}}
	c := s.Clone().(*state)
	c.removed["n1"] = append(c.removed["n1"][:len(c.removed["n1"]):len(c.removed["n1"])], preempt.Holder{UID: "b"})
	c.removed["n2"] = []preempt.Holder{{UID: "c"}}
	c.added["n1"] = []nominated{{uid: "x", req: allocator.Request{Units: 4}}}
	if len(s.removed["n1"]) != 1 || len(s.removed) != 1 || len(s.added) != 0 {
		t.Errorf("the original changed with its clone: removed %v, added %v", s.removed, s.added)
	}
}
