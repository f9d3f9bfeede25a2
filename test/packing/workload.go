package packing

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Pod is one pod of a workload: it arrives at At, asks for GiB of GPU memory
// on one GPU (one container), and runs for Life seconds once placed.
type Pod struct {
	ID   int     `json:"id"`
	At   float64 `json:"at"`   // seconds from the start
	GiB  uint64  `json:"gib"`  // request, in allocator units (1 unit = 1 GiB)
	Life float64 `json:"life"` // seconds it runs once placed
}

// SizeBand draws sizes uniformly from the integers Min..Max with relative Weight.
type SizeBand struct {
	Weight float64 `json:"weight"`
	Min    uint64  `json:"min_gib"`
	Max    uint64  `json:"max_gib"`
}

// Lifetime is a lifetime distribution: "exp" (exponential with Mean) or
// "lognormal" (mean Mean, shape Sigma: heavy-tailed, notebook-like).
type Lifetime struct {
	Kind  string  `json:"kind"`
	Mean  float64 `json:"mean_s"`
	Sigma float64 `json:"sigma,omitempty"`
}

// Mix is a workload's size and lifetime distributions.
type Mix struct {
	Name  string     `json:"name"`
	Sizes []SizeBand `json:"sizes"`
	Life  Lifetime   `json:"life"`
}

// UniformMix is any size from 1 to 16 GiB, an hour on average.
func UniformMix() Mix {
	return Mix{Name: "uniform", Sizes: []SizeBand{{Weight: 1, Min: 1, Max: 16}}, Life: Lifetime{Kind: "exp", Mean: 3600}}
}

// BimodalMix is many small inference pods (2-4 GiB, 90%) and some 40 GiB
// training pods (10%), half an hour on average.
func BimodalMix() Mix {
	return Mix{Name: "bimodal", Sizes: []SizeBand{{Weight: 0.9, Min: 2, Max: 4}, {Weight: 0.1, Min: 40, Max: 40}}, Life: Lifetime{Kind: "exp", Mean: 1800}}
}

// NotebookMix is 4-24 GiB notebooks with long heavy-tailed lifetimes
// (lognormal, 8 h mean).
func NotebookMix() Mix {
	return Mix{Name: "notebook", Sizes: []SizeBand{{Weight: 0.4, Min: 4, Max: 8}, {Weight: 0.4, Min: 9, Max: 16}, {Weight: 0.2, Min: 17, Max: 24}},
		Life: Lifetime{Kind: "lognormal", Mean: 8 * 3600, Sigma: 1.2}}
}

// MeanGiB returns the mean size of m.
func (m Mix) MeanGiB() float64 {
	var w, sum float64
	for _, b := range m.Sizes {
		w += b.Weight
		sum += b.Weight * float64(b.Min+b.Max) / 2
	}
	return sum / w
}

// MaxGiB returns the largest size m draws.
func (m Mix) MaxGiB() uint64 {
	var out uint64
	for _, b := range m.Sizes {
		out = max(out, b.Max)
	}
	return out
}

// Validate reports a mix that cannot be drawn from.
func (m Mix) Validate() error {
	var w float64
	for _, b := range m.Sizes {
		if b.Weight < 0 || b.Min == 0 || b.Min > b.Max {
			return fmt.Errorf("mix %s: bad size band %+v", m.Name, b)
		}
		w += b.Weight
	}
	if w <= 0 {
		return fmt.Errorf("mix %s: no size band with weight", m.Name)
	}
	switch {
	case m.Life.Mean <= 0:
		return fmt.Errorf("mix %s: lifetime mean %v", m.Name, m.Life.Mean)
	case m.Life.Kind == "exp":
	case m.Life.Kind == "lognormal" && m.Life.Sigma > 0:
	default:
		return fmt.Errorf("mix %s: bad lifetime %+v", m.Name, m.Life)
	}
	return nil
}

// GenSpec says how much of a mix to generate for a fleet.
type GenSpec struct {
	Mix         Mix     `json:"mix"`
	Seed        uint64  `json:"seed"`
	CapacityGiB uint64  `json:"capacity_gib"` // the fleet's memory
	Load        float64 `json:"load"`         // offered load: arrival rate x mean size x mean life / capacity
	Horizon     float64 `json:"horizon_s"`    // arrivals stop here
}

// Generate draws a workload: Poisson arrivals at the rate that offers Load
// times the capacity, sizes and lifetimes from the mix. Times are rounded to
// whole seconds (lifetimes at least one), so the files stay small and exact.
// The same spec always gives the same pods.
func Generate(g GenSpec) ([]Pod, error) {
	if err := g.Mix.Validate(); err != nil {
		return nil, err
	}
	if g.CapacityGiB == 0 || g.Load <= 0 || g.Horizon <= 0 {
		return nil, fmt.Errorf("generate %s: capacity %d, load %v, horizon %v", g.Mix.Name, g.CapacityGiB, g.Load, g.Horizon)
	}
	rng := rand.New(rand.NewPCG(g.Seed, 0x9e3779b97f4a7c15))
	rate := g.Load * float64(g.CapacityGiB) / (g.Mix.MeanGiB() * g.Mix.Life.Mean) // pods per second
	var total float64
	for _, b := range g.Mix.Sizes {
		total += b.Weight
	}
	var pods []Pod
	for t := rng.ExpFloat64() / rate; t < g.Horizon; t += rng.ExpFloat64() / rate {
		u := rng.Float64() * total
		band := g.Mix.Sizes[len(g.Mix.Sizes)-1]
		for _, b := range g.Mix.Sizes {
			if u < b.Weight {
				band = b
				break
			}
			u -= b.Weight
		}
		size := band.Min + rng.Uint64N(band.Max-band.Min+1)
		var life float64
		switch g.Mix.Life.Kind {
		case "exp":
			life = rng.ExpFloat64() * g.Mix.Life.Mean
		case "lognormal":
			s := g.Mix.Life.Sigma
			life = math.Exp(math.Log(g.Mix.Life.Mean) - s*s/2 + s*rng.NormFloat64())
		}
		pods = append(pods, Pod{ID: len(pods), At: math.Round(t), GiB: size, Life: max(1, math.Round(life))})
	}
	return pods, nil
}

// CheckWorkload reports pods out of order, with duplicate or unordered IDs,
// or with a zero size or a lifetime that is not positive.
func CheckWorkload(pods []Pod) error {
	for i, p := range pods {
		switch {
		case p.ID != i:
			return fmt.Errorf("pod %d has id %d: ids must be 0, 1, 2, ...", i, p.ID)
		case p.GiB == 0:
			return fmt.Errorf("pod %d asks for 0 GiB", p.ID)
		case !(p.Life > 0) || math.IsInf(p.Life, 0):
			return fmt.Errorf("pod %d lives %v s", p.ID, p.Life)
		case math.IsNaN(p.At) || math.IsInf(p.At, 0) || p.At < 0:
			return fmt.Errorf("pod %d arrives at %v", p.ID, p.At)
		case i > 0 && p.At < pods[i-1].At:
			return fmt.Errorf("pod %d arrives before pod %d", p.ID, i-1)
		}
	}
	return nil
}
