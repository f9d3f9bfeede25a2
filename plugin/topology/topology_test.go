package topology_test

import (
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/topology"
)

func TestPairScore(t *testing.T) {
	tests := []struct {
		level   topology.Level
		nvlinks int
		want    int
	}{
		{topology.LevelUnknown, 0, 0},
		{topology.LevelSystem, 0, 10},
		{topology.LevelNode, 0, 20},
		{topology.LevelHostBridge, 0, 30},
		{topology.LevelMultiple, 0, 40},
		{topology.LevelSingle, 0, 50},
		{topology.LevelInternal, 0, 60},
		{topology.LevelSystem, 1, 110},
		{topology.LevelSingle, 4, 450},
		{topology.LevelNode, 18, 1820},
		{topology.LevelUnknown, 2, 200},
		{topology.Level(99), -3, 0},
	}
	for _, tt := range tests {
		if got := topology.PairScore(tt.level, tt.nvlinks); got != tt.want {
			t.Errorf("PairScore(%v, %d) = %d, want %d", tt.level, tt.nvlinks, got, tt.want)
		}
	}
	// Any NVLink beats any PCIe path.
	if topology.PairScore(topology.LevelSystem, 1) <= topology.PairScore(topology.LevelInternal, 0) {
		t.Error("one NVLink across sockets does not beat the best PCIe path")
	}
}

func TestLevelString(t *testing.T) {
	if topology.LevelHostBridge.String() != "HOSTBRIDGE" || topology.Level(42).String() != "UNKNOWN" {
		t.Errorf("String: %s %s", topology.LevelHostBridge, topology.Level(42))
	}
}

func gpus(switchLinks ...int) []topology.GPU {
	out := make([]topology.GPU, len(switchLinks))
	for i, s := range switchLinks {
		out[i] = topology.GPU{Index: i, NUMANode: -1, SwitchLinks: s}
	}
	return out
}

func TestLinks(t *testing.T) {
	tests := []struct {
		name     string
		r        topology.Reading
		nvswitch bool
		want     []gpushare.GPULink
	}{
		{"no GPU", topology.Reading{}, false, nil},
		{"one GPU", topology.Reading{GPUs: gpus(18)}, false, nil},
		{"PCIe only", topology.Reading{GPUs: gpus(0, 0, 0), Pairs: []topology.Pair{
			{A: 0, B: 1, Level: topology.LevelSingle}, {A: 0, B: 2, Level: topology.LevelSystem}, {A: 1, B: 2, Level: topology.LevelSystem},
		}}, false, []gpushare.GPULink{{A: 0, B: 1, Score: 50}, {A: 0, B: 2, Score: 10}, {A: 1, B: 2, Score: 10}}},
		{"NVLink bridge and PCIe, pairs given B<A and out of order", topology.Reading{GPUs: gpus(0, 0, 0), Pairs: []topology.Pair{
			{A: 2, B: 1, Level: topology.LevelNode}, {A: 1, B: 0, Level: topology.LevelNode, NVLinks: 4},
		}}, false, []gpushare.GPULink{{A: 0, B: 1, Score: 420, NVLinks: 4}, {A: 0, B: 2, Score: 0}, {A: 1, B: 2, Score: 20}}},
		{"NVSwitch: every pair the same", topology.Reading{GPUs: gpus(18, 18, 18), Pairs: []topology.Pair{
			{A: 0, B: 1, Level: topology.LevelNode}, {A: 0, B: 2, Level: topology.LevelNode}, {A: 1, B: 2, Level: topology.LevelNode},
		}}, true, []gpushare.GPULink{{A: 0, B: 1, Score: 1820, NVLinks: 18}, {A: 0, B: 2, Score: 1820, NVLinks: 18}, {A: 1, B: 2, Score: 1820, NVLinks: 18}}},
		{"NVSwitch with a degraded GPU: the smaller count", topology.Reading{GPUs: gpus(18, 12)}, true,
			[]gpushare.GPULink{{A: 0, B: 1, Score: 1200, NVLinks: 12}}},
		{"only some GPUs on a switch", topology.Reading{GPUs: gpus(12, 12, 0)}, false,
			[]gpushare.GPULink{{A: 0, B: 1, Score: 1200, NVLinks: 12}, {A: 0, B: 2}, {A: 1, B: 2}}},
		{"pairs naming unknown GPUs are dropped, duplicate GPUs once", topology.Reading{
			GPUs:  []topology.GPU{{Index: 3}, {Index: 1}, {Index: 3}},
			Pairs: []topology.Pair{{A: 1, B: 3, Level: topology.LevelInternal}, {A: 1, B: 7, NVLinks: 2}},
		}, false, []gpushare.GPULink{{A: 1, B: 3, Score: 60}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := topology.Links(tt.r); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Links = %+v\nwant %+v", got, tt.want)
			}
			if got := tt.r.NVSwitch(); got != tt.nvswitch {
				t.Errorf("NVSwitch = %v, want %v", got, tt.nvswitch)
			}
		})
	}
}
