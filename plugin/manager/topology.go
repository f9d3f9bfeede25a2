package manager

import (
	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/topology"
)

// addPlacement sets each GPU's NUMA node and PCI bus ID from r.
func addPlacement(gpus []inventory.GPU, r topology.Reading) {
	for i := range gpus {
		for _, t := range r.GPUs {
			if t.Index == gpus[i].Index {
				numa := t.NUMANode
				gpus[i].NUMANode, gpus[i].PCIBusID = &numa, t.PCIBusID
			}
		}
	}
}

// withTopology adds the scored links of r to inv. A failed reading (err) or
// links the inventory refuses leave inv without links, logged: the topology
// only guides multi-GPU placement, and the plugin serves without it.
func (m *Manager) withTopology(inv *inventory.Inventory, r topology.Reading, err error) *inventory.Inventory {
	if err != nil {
		m.log.Warn("GPU topology not read; publishing the GPUs without links between them", zap.Error(err))
		return inv
	}
	out, err := inv.WithLinks(topology.Links(r))
	if err != nil {
		m.log.Warn("GPU topology not usable; publishing the GPUs without links between them", zap.Error(err))
		return inv
	}
	m.log.Info("GPU topology read", zap.Bool("nvswitch", r.NVSwitch()), zap.Int("links", len(r.Pairs)))
	return out
}
