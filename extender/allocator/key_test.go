package allocator

import (
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Key is the same for requests that differ only in the pod's name, and
// differs when any field Place reads differs: a remembered fit must never
// answer for a request placed otherwise.
func TestRequestKey(t *testing.T) {
	base := func() Request {
		r := RequestOf("ns/a", []gpushare.ContainerRequest{
			{Name: "main", Index: 0, Units: 8},
			{Name: "side", Index: 1, Units: 4},
			{Name: "init", Index: 0, Init: true, Units: 2},
		})
		r.Isolation = PodIsolation{need: 1, percent: 30}
		return r
	}
	renamed := base()
	renamed.Pod = "other/b"
	if base().Key() != renamed.Key() {
		t.Errorf("the pod's name changed the key: %q, %q", base().Key(), renamed.Key())
	}
	changes := map[string]func(*Request){
		"units":          func(r *Request) { r.Containers[0].Units = 9 },
		"index":          func(r *Request) { r.Containers[1].Index = 2 },
		"init":           func(r *Request) { r.Containers[1].Init = true },
		"sidecar":        func(r *Request) { r.Containers[2].Sidecar = true },
		"container name": func(r *Request) { r.Containers[0].Name = "mai" },
		"name boundary":  func(r *Request) { r.Containers[0].Name, r.Containers[1].Name = "main,1", "de" },
		"order":          func(r *Request) { r.Containers[0], r.Containers[1] = r.Containers[1], r.Containers[0] },
		"one fewer":      func(r *Request) { r.Containers = r.Containers[:2] },
		"tier":           func(r *Request) { r.Isolation.need = 2 },
		"compute share":  func(r *Request) { r.Isolation.percent = 31 },
		"gpu count":      func(r *Request) { r.GPUs.Count = 2 },
		"links required": func(r *Request) { r.GPUs.LinksRequired = true },
	}
	seen := map[string]string{base().Key(): "base"}
	for name, change := range changes {
		r := base()
		r.Containers = append([]gpushare.ContainerRequest(nil), r.Containers...)
		change(&r)
		k := r.Key()
		if prev, dup := seen[k]; dup {
			t.Errorf("%s: key %q equals %s's", name, k, prev)
		}
		seen[k] = name
	}
}
