package gpushare

// ChargesByGPU returns the units a pod charges on each GPU, given which GPU
// each of its gpu-mem containers runs on: per GPU, the Kubernetes request rule
// (PodUnits) over the containers placed there. On one GPU that is the pod's
// whole request; when a pod is split across GPUs, its init containers peak on
// their own GPU instead of being summed with regular containers elsewhere.
// The extender, the device plugin and the inspector all charge through this.
func ChargesByGPU(reqs []ContainerRequest, gpuOf func(ContainerRequest) int) map[int]uint64 {
	byGPU := map[int][]ContainerRequest{}
	for _, c := range reqs {
		g := gpuOf(c)
		byGPU[g] = append(byGPU[g], c)
	}
	out := make(map[int]uint64, len(byGPU))
	for g, cs := range byGPU {
		out[g] = PodUnits(cs)
	}
	return out
}

// Charges returns the units the pod with this assignment and these container
// requests charges on each GPU (see ChargesByGPU). Every container must have
// a GPU by GPUFor, and the allocation must charge no container that asks for
// nothing; otherwise it is an *AssignmentError, since accounting would drift.
func (p PodAssignment) Charges(reqs []ContainerRequest) (map[int]uint64, error) {
	regular, err := p.ContainerGPUs(reqs)
	if err != nil {
		return nil, err
	}
	initGPU := map[int]int{}
	for _, c := range reqs {
		if c.Init {
			g, err := p.GPUFor(c)
			if err != nil {
				return nil, err
			}
			initGPU[c.Index] = g
		}
	}
	return ChargesByGPU(reqs, func(c ContainerRequest) int {
		if c.Init {
			return initGPU[c.Index]
		}
		return regular[c.Index]
	}), nil
}
