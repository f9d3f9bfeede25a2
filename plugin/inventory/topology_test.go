package inventory_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
)

func TestWithLinks(t *testing.T) {
	numa := 1
	inv, err := inventory.New([]inventory.GPU{
		{Index: 2, UUID: "c", MemoryMiB: 1024}, {Index: 0, UUID: "a", MemoryMiB: 1024, NUMANode: &numa, PCIBusID: "00000000:1B:00.0"},
		{Index: 1, UUID: "b", MemoryMiB: 1024},
	}, gpushare.GiB)
	if err != nil {
		t.Fatal(err)
	}
	good := []gpushare.GPULink{{A: 0, B: 1, Score: 450, NVLinks: 4}, {A: 0, B: 2, Score: 10}, {A: 1, B: 2, Score: 10}}
	for name, links := range map[string][]gpushare.GPULink{
		"none":         nil,
		"one missing":  good[:2],
		"out of order": {good[1], good[0], good[2]},
		"one too many": append(append([]gpushare.GPULink{}, good...), gpushare.GPULink{A: 1, B: 2}),
		"unknown GPU":  {good[0], good[1], {A: 1, B: 3}},
		"negative":     {good[0], good[1], {A: 1, B: 2, Score: -1}},
	} {
		if got, err := inv.WithLinks(links); !errors.Is(err, inventory.ErrInvalidInventory) || got != inv {
			t.Errorf("%s: WithLinks = %v; want ErrInvalidInventory and inv unchanged", name, err)
		}
	}
	with, err := inv.WithLinks(good)
	if err != nil {
		t.Fatal(err)
	}
	good[0].Score = 1 // the inventory keeps its own copy
	n := with.NodeGPUs(false)
	if n.Links[0].Score != 450 || len(n.Links) != 3 || inv.NodeGPUs(false).Links != nil {
		t.Errorf("links = %+v", n.Links)
	}
	if g := n.GPUs[0]; g.NUMANode == nil || *g.NUMANode != 1 || g.PCIBusID != "00000000:1B:00.0" || n.GPUs[1].NUMANode != nil {
		t.Errorf("GPUs = %+v", n.GPUs)
	}
	// Links survive health changes.
	sick, _, err := with.SetUnhealthy(1, "Xid 48", inventory.Never, with.GPUs()[0].LastBad)
	if err != nil || !reflect.DeepEqual(sick.NodeGPUs(false).Links, n.Links) {
		t.Errorf("after SetUnhealthy: %+v, %v", sick.NodeGPUs(false).Links, err)
	}
	if _, err := gpushare.EncodeNodeGPUs(n); err != nil {
		t.Errorf("encode: %v", err)
	}
	// A one-GPU inventory has no pairs.
	one, _ := inventory.New([]inventory.GPU{{Index: 0, UUID: "a", MemoryMiB: 1024}}, gpushare.GiB)
	if _, err := one.WithLinks(nil); err != nil {
		t.Errorf("one GPU, no links: %v", err)
	}
}
