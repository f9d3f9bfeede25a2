package packing

import (
	"testing"
	"time"
)

// BenchmarkFill measures the simulator's placement rate through the real
// allocator: filling the 100 x 8 x 80 GiB fleet with uniform 1-16 GiB pods
// (about 7,450 placements, each scoring every node that has room).
func BenchmarkFill(b *testing.B) {
	f := LargeFleet()
	pods, err := Generate(GenSpec{Mix: UniformMix(), Seed: 1, CapacityGiB: f.CapacityGiB(), Load: 2, Horizon: 3600})
	if err != nil {
		b.Fatal(err)
	}
	for _, run := range Runs() {
		b.Run(run.Name(), func(b *testing.B) {
			var placed int
			start := time.Now()
			for b.Loop() {
				r, err := Fill(f, pods, Options{Policy: run.Policy, Ties: run.Ties, Seed: 1})
				if err != nil {
					b.Fatal(err)
				}
				placed += r.Pods
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(placed), "ns/placement")
		})
	}
}

// BenchmarkChurn measures a churn replay: the 100 x 8 x 80 GiB fleet, uniform
// pods at load 1.2 for three mean lifetimes (about 27,000 arrivals), with
// samples but no FFD reference.
func BenchmarkChurn(b *testing.B) {
	f := LargeFleet()
	spec := GenSpec{Mix: UniformMix(), Seed: 1, CapacityGiB: f.CapacityGiB(), Load: 1.2, Horizon: 3 * 3600}
	pods, err := Generate(spec)
	if err != nil {
		b.Fatal(err)
	}
	for _, run := range Runs() {
		b.Run(run.Name(), func(b *testing.B) {
			var placed int
			start := time.Now()
			for b.Loop() {
				r, err := Churn(f, pods, ChurnOptions{Options: Options{Policy: run.Policy, Ties: run.Ties, Seed: 1}, Horizon: spec.Horizon, SampleEvery: 60})
				if err != nil {
					b.Fatal(err)
				}
				placed += r.Placements
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(placed), "ns/placement")
		})
	}
}

// BenchmarkFFD measures the reference: FFD of 8,000 uniform pods into the large fleet.
func BenchmarkFFD(b *testing.B) {
	f := LargeFleet()
	pods, err := Generate(GenSpec{Mix: UniformMix(), Seed: 1, CapacityGiB: f.CapacityGiB(), Load: 2.2, Horizon: 3600})
	if err != nil {
		b.Fatal(err)
	}
	items := make([]uint64, 0, 8000)
	for _, p := range pods[:min(8000, len(pods))] {
		items = append(items, p.GiB)
	}
	bins := f.Bins()
	for b.Loop() {
		FFD(bins, items)
	}
}
