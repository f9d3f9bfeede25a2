package server

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// nodeNameCases are arrays the fast path takes and arrays it must leave to
// encoding/json, with what both must answer.
var nodeNameCases = []string{
	`["n1","gpu-node-02.example.com","n1"]`,
	` [ "a" ,	"b"
	, "c" ] `,
	`[]`,
	`[ ]`,
	`[""]`,
	`["esc\"aped", "tab\t", "\u00e9t\u00e9"]`,
	`["caf` + "\xc3\xa9" + `"]`,
	`["a", null]`,
	`["a",]`,
	`["a" "b"]`,
	`["a"] x`,
	`["unterminated`,
	`[1]`,
	`"n1"`,
	`{"a":1}`,
	`null`,
	``,
}

func TestParseNodeNamesMatchesEncodingJSON(t *testing.T) {
	for _, raw := range nodeNameCases {
		checkNodeNames(t, []byte(raw))
	}
}

// The plain ASCII arrays the scheduler sends take the fast path: one string
// for the array, one slice for the names.
func TestParseNodeNamesAllocations(t *testing.T) {
	var b strings.Builder
	b.WriteString("[")
	for i := range 1000 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"node-` + strings.Repeat("x", i%7) + `"`)
	}
	b.WriteString("]")
	raw := []byte(b.String())
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := parseNodeNames(raw); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3 {
		t.Errorf("parsing 1,000 names took %v allocations, want at most 3", allocs)
	}
}

// FuzzNodeNames checks the fast path against encoding/json on any input.
func FuzzNodeNames(f *testing.F) {
	for _, raw := range nodeNameCases {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) { checkNodeNames(t, raw) })
}

func checkNodeNames(t *testing.T, raw []byte) {
	t.Helper()
	var want []string
	wantErr := json.Unmarshal(raw, &want)
	got, err := parseNodeNames(raw)
	if (err != nil) != (wantErr != nil) {
		t.Fatalf("parseNodeNames(%q) error %v; encoding/json: %v", raw, err, wantErr)
	}
	if err == nil && (!reflect.DeepEqual(got, want) || (got == nil) != (want == nil)) {
		t.Fatalf("parseNodeNames(%q) = %#v; encoding/json: %#v", raw, got, want)
	}
}
