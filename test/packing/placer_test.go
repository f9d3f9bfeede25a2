package packing

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/extender/allocator"
)

// lowestFirst is a Placer that takes the lowest node and, on it, the
// lowest GPUs with room: the extender's firstfit with the lowest node
// winning ties, for single-GPU pods. bad, when set, rewrites what it
// returns.
type lowestFirst struct {
	held     map[int]bool
	placed   int
	released int
	bad      func(Placement) Placement
}

func (l *lowestFirst) Place(p Pod, nodes []allocator.Node) (Placement, bool, error) {
	for i, n := range nodes {
		charges := map[int]uint64{}
		for _, g := range n.GPUs {
			if len(charges) < p.Count() && g.Free() >= p.PerGPU() {
				charges[g.Index] = p.PerGPU()
			}
		}
		if len(charges) == p.Count() {
			l.held[p.ID] = true
			l.placed++
			pl := Placement{Node: i, Charges: charges}
			if l.bad != nil {
				pl = l.bad(pl)
			}
			return pl, true, nil
		}
	}
	return Placement{}, false, nil
}

func (l *lowestFirst) Release(p Pod) error {
	if !l.held[p.ID] {
		return errors.New("not held")
	}
	delete(l.held, p.ID)
	l.released++
	return nil
}

// TestPlacer: a run through a Placer is charged, released and reported as
// the extender's are; a placer that equals firstfit gives firstfit's
// results; and one that returns what the pod did not ask for is caught.
func TestPlacer(t *testing.T) {
	f, spec := smallSpec(UniformMix(), 2, 1.2)
	spec.Horizon = 6 * spec.Mix.Life.Mean
	pods, err := Generate(spec)
	if err != nil {
		t.Fatal(err)
	}
	var last *lowestFirst
	mk := func(bad func(Placement) Placement) NewPlacer {
		return func(Fleet, Options) (Placer, error) {
			last = &lowestFirst{held: map[int]bool{}, bad: bad}
			return last, nil
		}
	}
	opt := ChurnOptions{Options: Options{Placer: mk(nil)}, SampleEvery: 600}
	got, err := Churn(f, pods, opt)
	if err != nil {
		t.Fatal(err)
	}
	if last.placed != got.Placements || last.released != got.Departures || len(last.held) != got.EndRunning || got.Policy != "placer" {
		t.Fatalf("placer placed %d, released %d, holds %d; churn %+v", last.placed, last.released, len(last.held), got)
	}
	opt.Options = Options{Policy: allocator.FirstFit}
	want, err := Churn(f, pods, opt)
	if err != nil {
		t.Fatal(err)
	}
	got.Policy = want.Policy
	if !reflect.DeepEqual(got, want) {
		t.Errorf("a placer equal to firstfit: %+v, firstfit %+v", got.Samples[len(got.Samples)-1], want.Samples[len(want.Samples)-1])
	}
	fill, err := Fill(f, pods, Options{Placer: mk(nil)})
	ff, _ := Fill(f, pods, Options{Policy: allocator.FirstFit})
	if fill.Policy = ff.Policy; err != nil || !reflect.DeepEqual(fill, ff) {
		t.Errorf("fill through the placer %+v %v, firstfit %+v", fill, err, ff)
	}
	for name, bad := range map[string]func(Placement) Placement{
		"over the GPU": func(pl Placement) Placement {
			for k := range pl.Charges {
				pl.Charges[k] = 25
			}
			return pl
		},
		"another share": func(pl Placement) Placement {
			for k := range pl.Charges {
				pl.Charges[k]++
			}
			return pl
		},
		"two GPUs": func(pl Placement) Placement {
			pl.Charges = map[int]uint64{0: 1, 1: 1}
			return pl
		},
		"no node": func(pl Placement) Placement { pl.Node = 99; return pl },
		"always GPU 0": func(pl Placement) Placement {
			for _, v := range pl.Charges {
				pl.Node, pl.Charges = 0, map[int]uint64{0: v}
			}
			return pl
		},
	} {
		opt.Options = Options{Placer: mk(bad)}
		if _, err := Churn(f, pods, opt); !errors.Is(err, ErrBookkeeping) {
			t.Errorf("%s: %v, want ErrBookkeeping", name, err)
		}
	}
	if r := (Run{Label: "dra", Ties: TieRandom, Placer: mk(nil)}); r.Name() != "dra" {
		t.Errorf("a placer's run is named %q", r.Name())
	}
	s := Scenario{Name: "small", Fleet: f, Gen: spec, Warmup: 3600, SampleEvery: 600, RefEvery: 4}
	rep, err := RunScenario(s, pods, []Run{{Label: "mine", Placer: mk(nil)}})
	if err != nil || rep.Fill.Runs[0].Policy != "mine" || rep.Churn[0].Run != "mine" || rep.Churn[0].Result.Policy != "mine" {
		t.Errorf("scenario through a placer: %v %+v", err, rep.Fill.Runs)
	}
}
