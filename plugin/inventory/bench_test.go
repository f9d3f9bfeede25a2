package inventory_test

import (
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// BenchmarkListAndWatchH200 builds and encodes the ListAndWatch message of
// simulated:dgxh200 (8 × H200) at the units an operator would pick, reporting
// its size and device count.
func BenchmarkListAndWatchH200(b *testing.B) {
	sim, err := nvml.NewSimulator(nil, "simulated:dgxh200")
	if err != nil {
		b.Fatal(err)
	}
	defer sim.Shutdown()
	gpus, err := sim.Devices()
	if err != nil {
		b.Fatal(err)
	}
	var in []inventory.GPU
	for _, g := range gpus {
		in = append(in, inventory.GPU{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryMiB: g.MemoryMiB})
	}
	for _, unit := range []gpushare.Unit{gpushare.GiB, 256, 64} {
		b.Run(unit.String(), func(b *testing.B) {
			inv, err := inventory.New(in, unit)
			if err != nil {
				b.Fatal(err)
			}
			if err := inv.CheckMessageSize(inventory.KubeletMaxMessageSize); err != nil {
				b.Fatal(err)
			}
			var size int
			for b.Loop() {
				msg, err := proto.Marshal(&pluginapi.ListAndWatchResponse{Devices: inv.Devices()})
				if err != nil {
					b.Fatal(err)
				}
				size = len(msg)
			}
			b.ReportMetric(float64(size), "bytes/msg")
			b.ReportMetric(float64(inv.TotalUnits()), "devices")
		})
	}
}
