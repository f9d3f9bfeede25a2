package packing

import (
	"fmt"

	"github.com/gpushare/gpushare/extender/allocator"
)

// Scenario is a fleet and the workload replayed against it.
type Scenario struct {
	Name        string  `json:"name"`
	Fleet       Fleet   `json:"fleet"`
	Gen         GenSpec `json:"workload"`
	Warmup      float64 `json:"warmup_s"` // the steady window starts here and ends at Gen.Horizon
	SampleEvery float64 `json:"sample_every_s"`
	RefEvery    int     `json:"ffd_every"` // every RefEvery-th sample of the window carries the FFD reference
}

// File is the scenario's workload file name: gzip-compressed JSON lines.
func (s Scenario) File() string { return s.Name + ".jsonl.gz" }

// Run is one simulated scheduler setting.
type Run struct {
	Policy allocator.Policy
	Ties   Tie
	Blind  bool // nodes publish no topology (Options.Blind)
	// Nodes is how nodes are ranked (Options.NodeScore).
	Nodes NodeScore
	// Placer replaces the extender (Options.Placer); Label then names the
	// run, whole, and Policy, Blind and Nodes do not apply (Ties and the
	// seed are the placer's to use).
	Placer NewPlacer
	Label  string
}

// Name is how reports label r: the policy, with "/random" for random ties
// and "/blind" for a topology-blind run; a placer's run is its Label.
func (r Run) Name() string {
	if r.Placer != nil || r.Label != "" {
		return r.Label
	}
	name := r.Policy.String()
	if r.Ties == TieRandom {
		name += "/random"
	}
	if r.Blind {
		name += "/blind"
	}
	if r.Nodes == ScoreMostAllocated {
		name += "/mostallocated"
	}
	return name
}

// Runs are the settings every scenario is replayed with: the three policies
// with the lowest node winning ties, the default policy with random ties,
// and the default policy's GPU choice with nodes ranked by kube-scheduler's
// MostAllocated instead of the prioritize verb (random ties, as the
// scheduler breaks them): the profile without prioritize.
func Runs() []Run {
	return []Run{{Policy: allocator.BestFit}, {Policy: allocator.FirstFit}, {Policy: allocator.Spread}, {Policy: allocator.BestFit, Ties: TieRandom},
		{Policy: allocator.BestFit, Ties: TieRandom, Nodes: ScoreMostAllocated}}
}

// RunsFor are the settings s is replayed with: Runs, and for a workload of
// multi-GPU pods the default policy topology-blind too, the baseline the
// topology-aware choice is measured against.
func RunsFor(s Scenario) []Run {
	runs := Runs()
	if s.Gen.Mix.MultiGPU() {
		runs = append(runs, Run{Policy: allocator.BestFit, Blind: true})
	}
	return runs
}

// scenario builds a scenario whose horizon and warm-up count in mean lifetimes.
func scenario(name string, f Fleet, m Mix, seed uint64, load, lives, warmLives float64) Scenario {
	life := m.Life.Mean
	return Scenario{
		Name: name, Fleet: f,
		Gen:    GenSpec{Mix: m, Seed: seed, CapacityGiB: f.CapacityGiB(), Load: load, Horizon: lives * life},
		Warmup: warmLives * life, SampleEvery: lives * life / 200, RefEvery: 10,
	}
}

// Scenarios are the benchmark's scenarios. Most offer 1.2 times the fleet's
// memory (saturation: pods keep waiting, so packing, not demand, limits what
// is allocated) for long enough to reach a steady state; one offers 0.7 (pods
// rarely wait: what differs is how many cards are open and how fragmented
// the free memory is).
func Scenarios() []Scenario {
	return []Scenario{
		scenario("large-uniform", LargeFleet(), UniformMix(), 1, 1.2, 4, 2),
		scenario("large-bimodal", LargeFleet(), BimodalMix(), 2, 1.2, 4, 2),
		scenario("large-notebook", LargeFleet(), NotebookMix(), 3, 1.2, 6, 3),
		scenario("large-uniform-load70", LargeFleet(), UniformMix(), 7, 0.7, 6, 4),
		scenario("small-uniform", SmallFleet(), UniformMix(), 4, 1.2, 40, 4),
		scenario("small-notebook", SmallFleet(), NotebookMix(), 5, 1.2, 40, 4),
		scenario("mixed-bimodal", MixedFleet(), BimodalMix(), 6, 1.2, 6, 2),
		scenario("islands-multigpu", IslandsFleet(), MultiGPUMix(), 8, 1.0, 4, 2),
	}
}

// Validate reports a scenario whose workload could not all fit its fleet.
func (s Scenario) Validate() error {
	if err := s.Fleet.Validate(); err != nil {
		return err
	}
	if err := s.Gen.Mix.Validate(); err != nil {
		return err
	}
	if s.Gen.Mix.MaxPerGPU() > s.Fleet.LargestGiB() {
		return fmt.Errorf("scenario %s: pods of %d GiB per GPU, largest GPU %d GiB", s.Name, s.Gen.Mix.MaxPerGPU(), s.Fleet.LargestGiB())
	}
	for _, b := range s.Gen.Mix.Sizes {
		if k := max(1, b.GPUs); b.Weight > 0 && !s.Fleet.Holds(k, b.Max/uint64(k)) {
			return fmt.Errorf("scenario %s: no node holds the pods of %d GPUs of %d GiB", s.Name, k, b.Max)
		}
	}
	if s.Gen.CapacityGiB != s.Fleet.CapacityGiB() {
		return fmt.Errorf("scenario %s: workload sized for %d GiB, fleet has %d", s.Name, s.Gen.CapacityGiB, s.Fleet.CapacityGiB())
	}
	if s.Warmup >= s.Gen.Horizon || s.SampleEvery <= 0 {
		return fmt.Errorf("scenario %s: warm-up %v, horizon %v, sample every %v", s.Name, s.Warmup, s.Gen.Horizon, s.SampleEvery)
	}
	return nil
}

// Steady is a churn run's steady state: averages over the samples from the
// warm-up on. Fractions are of the fleet's memory (or cards).
type Steady struct {
	From             float64 `json:"from_s"`
	Samples          int     `json:"samples"`
	Allocated        float64 `json:"allocated"`          // allocated fraction
	Fragmented       float64 `json:"fragmented"`         // free memory no pending pod can use
	FragmentedOfFree float64 `json:"fragmented_of_free"` // the same, over the free memory
	Stranded         float64 `json:"stranded"`           // free memory a new pod of the mix could not use (expected)
	StrandedOfFree   float64 `json:"stranded_of_free"`
	Waiting          float64 `json:"waiting"` // share of the samples with pods waiting
	Pending          float64 `json:"pending"` // pods waiting
	PendingGiB       float64 `json:"pending_gib"`
	Cards            float64 `json:"cards"` // fraction of GPUs with something on them
	// At the samples that carry the FFD reference: the policy's allocated
	// fraction, FFD's packing of the same pods (running and pending) into the
	// empty fleet, the capacity bound min(1, demand/capacity), and the ratios.
	RefSamples   int     `json:"ffd_samples"`
	AtRef        float64 `json:"allocated_at_ffd_samples"`
	FFDAllocated float64 `json:"ffd_allocated"`
	FFDCards     float64 `json:"ffd_cards"`
	Bound        float64 `json:"bound"`
	RatioFFD     float64 `json:"ratio_to_ffd"`
	RatioBound   float64 `json:"ratio_to_bound"`
}

// Summarize averages r's samples at or after from.
func Summarize(r ChurnResult, from float64) Steady {
	s := Steady{From: from}
	capacity, cards := float64(r.Capacity), float64(r.Cards)
	var free float64
	for _, x := range r.Samples {
		if x.T < from {
			continue
		}
		s.Samples++
		s.Allocated += float64(x.AllocatedGiB) / capacity
		s.Fragmented += float64(x.FragmentedGiB) / capacity
		s.Stranded += x.StrandedGiB / capacity
		if x.Pending > 0 {
			s.Waiting++
		}
		free += float64(r.Capacity - x.AllocatedGiB)
		s.Pending += float64(x.Pending)
		s.PendingGiB += float64(x.PendingGiB)
		s.Cards += float64(x.Cards) / cards
		if x.Ref != nil {
			s.RefSamples++
			s.AtRef += float64(x.AllocatedGiB) / capacity
			s.FFDAllocated += float64(x.Ref.PlacedGiB) / capacity
			s.FFDCards += float64(x.Ref.BinsUsed) / cards
			s.Bound += min(1, float64(x.AllocatedGiB+x.PendingGiB)/capacity)
		}
	}
	if free > 0 {
		s.FragmentedOfFree = s.Fragmented * capacity / free
		s.StrandedOfFree = s.Stranded * capacity / free
	}
	if n := float64(s.Samples); n > 0 {
		s.Allocated /= n
		s.Fragmented /= n
		s.Stranded /= n
		s.Waiting /= n
		s.Pending /= n
		s.PendingGiB /= n
		s.Cards /= n
	}
	if n := float64(s.RefSamples); n > 0 {
		s.AtRef /= n
		s.FFDAllocated /= n
		s.FFDCards /= n
		s.Bound /= n
		s.RatioFFD = s.AtRef / s.FFDAllocated
		s.RatioBound = s.AtRef / s.Bound
	}
	return s
}

// ChurnReport is one run's churn result and steady state.
type ChurnReport struct {
	Run    string      `json:"run"`
	Steady Steady      `json:"steady"`
	Result ChurnResult `json:"result"`
}

// FillReport is the fill-until-first-failure results of a scenario.
type FillReport struct {
	BoundGiB uint64       `json:"bound_gib"` // the fleet's memory
	FFD      FillResult   `json:"ffd"`
	Runs     []FillResult `json:"runs"`
}

// Report is everything measured for one scenario.
type Report struct {
	Scenario Scenario      `json:"scenario"`
	Pods     int           `json:"pods"`
	Fill     FillReport    `json:"fill"`
	Churn    []ChurnReport `json:"churn"`
}

// RunScenario replays pods (the scenario's workload) with every run: fill
// until the first failure, then churn, each compared with FFD.
func RunScenario(s Scenario, pods []Pod, runs []Run) (Report, error) {
	if err := s.Validate(); err != nil {
		return Report{}, err
	}
	if err := CheckWorkload(pods); err != nil {
		return Report{}, err
	}
	rep := Report{Scenario: s, Pods: len(pods)}
	rep.Fill.BoundGiB = s.Fleet.CapacityGiB()
	rep.Fill.FFD = FillReference(s.Fleet, pods)
	for i, r := range runs {
		opt := Options{Policy: r.Policy, Ties: r.Ties, Seed: s.Gen.Seed + uint64(i), Blind: r.Blind, NodeScore: r.Nodes, Placer: r.Placer}
		f, err := Fill(s.Fleet, pods, opt)
		if err != nil {
			return Report{}, fmt.Errorf("%s %s fill: %w", s.Name, r.Name(), err)
		}
		f.Policy = r.Name()
		f.FFDPods = rep.Fill.FFD.Pods
		f.RatioFFD = float64(f.PlacedGiB) / float64(rep.Fill.FFD.PlacedGiB)
		rep.Fill.Runs = append(rep.Fill.Runs, f)
		c, err := Churn(s.Fleet, pods, ChurnOptions{Options: opt, Horizon: s.Gen.Horizon, SampleEvery: s.SampleEvery, RefFrom: s.Warmup, RefEvery: s.RefEvery})
		if err != nil {
			return Report{}, fmt.Errorf("%s %s churn: %w", s.Name, r.Name(), err)
		}
		c.Policy = r.Name()
		rep.Churn = append(rep.Churn, ChurnReport{Run: r.Name(), Steady: Summarize(c, s.Warmup), Result: c})
	}
	return rep, nil
}
