package cache

import (
	"fmt"
	"testing"

	"github.com/gpushare/gpushare/extender/allocator"
)

// publishedNodes answers each name with its latest Published, settled or
// recent, forgets a removed node, and a reader still holding the index from before a removal
// sees the node gone, not its last snapshot.
func TestPublishedNodes(t *testing.T) {
	var p publishedNodes
	if _, ok := p.load("a"); ok {
		t.Fatal("an empty index knows a node")
	}
	pub := func(name string) *Published { return &Published{View: &allocator.Node{Name: name}} }
	const nodes = 2*recentMax + 100 // names in both maps
	for i := range nodes {
		p.store(fmt.Sprintf("n%d", i), pub(fmt.Sprintf("n%d", i)))
	}
	second := pub("n7")
	p.store("n7", second)
	if got, ok := p.load("n7"); !ok || got != second {
		t.Fatalf("n7 after an update: %v %v, want the second snapshot", got, ok)
	}
	p.store("n3", nil) // a settled name
	before := p.index.Load()
	p.store("n7", nil)
	if _, ok := p.load("n7"); ok {
		t.Fatal("a removed node is still published")
	}
	if s := before.settled["n7"].Load(); s != nil {
		t.Fatal("a reader of the index from before the removal still sees the node")
	}
	last := fmt.Sprintf("n%d", nodes-1) // a recent name
	p.store(last, nil)
	if idx := p.index.Load(); len(idx.settled)+len(idx.recent) != nodes-3 || len(idx.recent) == 0 {
		t.Fatalf("index holds %d settled and %d recent names after three removals of %d", len(idx.settled), len(idx.recent), nodes)
	}
	p.store("never", nil) // removing an unknown node changes nothing
	for i := range nodes {
		name := fmt.Sprintf("n%d", i)
		if got, ok := p.load(name); ok != (i != 3 && i != 7 && i != nodes-1) || ok && got.View.Name != name {
			t.Fatalf("%s: %v %v", name, got, ok)
		}
	}
}

// BenchmarkPublishNodes is the cost of publishing n nodes one by one, as a
// cache's first list does.
func BenchmarkPublishNodes(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("node-%05d", i)
		}
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for b.Loop() {
				var p publishedNodes
				for _, name := range names {
					p.store(name, &Published{})
				}
			}
		})
	}
}
