package packing

import (
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Pod is one pod of a workload: it arrives at At, asks for GiB of GPU memory
// (one container), and runs for Life seconds once placed. With GPUs M > 1 it
// is a multi-GPU pod (aliyun.com/gpu-count "M"): GiB/M on each of M GPUs of
// one node; 0 or 1 is one GPU, and 0 is what workloads written before
// multi-GPU pods read as.
type Pod struct {
	ID   int     `json:"id"`
	At   float64 `json:"at"`             // seconds from the start
	GiB  uint64  `json:"gib"`            // request, in allocator units (1 unit = 1 GiB)
	Life float64 `json:"life"`           // seconds it runs once placed
	GPUs int     `json:"gpus,omitempty"` // GPUs it spans; 0 or 1: one
}

// Count returns the number of GPUs p spans: 1 for a single-GPU pod.
func (p Pod) Count() int { return max(1, p.GPUs) }

// PerGPU returns the GiB p takes on each of its GPUs.
func (p Pod) PerGPU() uint64 { return p.GiB / uint64(p.Count()) }

// SizeBand draws sizes uniformly from the integers Min..Max with relative
// Weight. With GPUs M > 1 its pods span M GPUs and sizes are drawn uniformly
// from the multiples of M in Min..Max (both must be multiples of M), so that
// each GPU gets a whole number of GiB.
type SizeBand struct {
	Weight float64 `json:"weight"`
	Min    uint64  `json:"min_gib"`
	Max    uint64  `json:"max_gib"`
	GPUs   int     `json:"gpus,omitempty"`
}

// count is the band's GPUs per pod: 1 for single-GPU pods.
func (b SizeBand) count() int { return max(1, b.GPUs) }

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

// MultiGPUMix is the uniform mix's single-GPU pods (1-16 GiB, 90%) with
// two-GPU pods of 16-64 GiB (5%) and four-GPU pods of 32-128 GiB (5%), so 8
// to 32 GiB on each of their GPUs; an hour on average. Issue 15's packing
// question: how often the multi-GPU pods get NVLink-connected GPUs.
func MultiGPUMix() Mix {
	return Mix{Name: "multigpu", Sizes: []SizeBand{{Weight: 0.9, Min: 1, Max: 16}, {Weight: 0.05, Min: 16, Max: 64, GPUs: 2}, {Weight: 0.05, Min: 32, Max: 128, GPUs: 4}},
		Life: Lifetime{Kind: "exp", Mean: 3600}}
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

// MaxPerGPU returns the most m draws on one GPU.
func (m Mix) MaxPerGPU() uint64 {
	var out uint64
	for _, b := range m.Sizes {
		out = max(out, b.Max/uint64(b.count()))
	}
	return out
}

// MaxCount returns the most GPUs a pod of m spans.
func (m Mix) MaxCount() int {
	out := 1
	for _, b := range m.Sizes {
		out = max(out, b.count())
	}
	return out
}

// MultiGPU reports whether m draws multi-GPU pods.
func (m Mix) MultiGPU() bool { return m.MaxCount() > 1 }

// Validate reports a mix that cannot be drawn from.
func (m Mix) Validate() error {
	var w float64
	for _, b := range m.Sizes {
		if b.Weight < 0 || b.Min == 0 || b.Min > b.Max || b.GPUs < 0 || b.GPUs > gpushare.MaxGPUsPerNode {
			return fmt.Errorf("mix %s: bad size band %+v", m.Name, b)
		}
		if k := uint64(b.count()); b.Min%k != 0 || b.Max%k != 0 {
			return fmt.Errorf("mix %s: size band %+v: sizes must be multiples of its %d GPUs", m.Name, b, k)
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
		k := uint64(band.count())
		size := band.Min + k*rng.Uint64N((band.Max-band.Min)/k+1) // k = 1: the draw of single-GPU workloads
		var life float64
		switch g.Mix.Life.Kind {
		case "exp":
			life = rng.ExpFloat64() * g.Mix.Life.Mean
		case "lognormal":
			s := g.Mix.Life.Sigma
			life = math.Exp(math.Log(g.Mix.Life.Mean) - s*s/2 + s*rng.NormFloat64())
		}
		p := Pod{ID: len(pods), At: math.Round(t), GiB: size, Life: max(1, math.Round(life))}
		if band.GPUs > 1 {
			p.GPUs = band.GPUs
		}
		pods = append(pods, p)
	}
	return pods, nil
}

// CheckWorkload reports pods out of order, with duplicate or unordered IDs,
// with a zero size or a lifetime that is not positive, or multi-GPU pods
// whose size their GPUs do not divide.
func CheckWorkload(pods []Pod) error {
	for i, p := range pods {
		switch {
		case p.ID != i:
			return fmt.Errorf("pod %d has id %d: ids must be 0, 1, 2, ...", i, p.ID)
		case p.GiB == 0:
			return fmt.Errorf("pod %d asks for 0 GiB", p.ID)
		case p.GPUs < 0 || p.GPUs > gpushare.MaxGPUsPerNode:
			return fmt.Errorf("pod %d spans %d GPUs", p.ID, p.GPUs)
		case p.GiB%uint64(p.Count()) != 0:
			return fmt.Errorf("pod %d: %d GiB do not divide evenly over its %d GPUs", p.ID, p.GiB, p.GPUs)
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
