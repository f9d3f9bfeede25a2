package gpushare

// ChargesByGPU returns the units a pod charges on each GPU, given which GPU
// each of its gpu-mem containers runs on: per GPU, the Kubernetes request rule
// (PodUnits) over the containers placed there. On one GPU that is the pod's
// whole request; when a pod is split across GPUs, its init containers peak on
// their own GPU instead of being summed with regular containers elsewhere.
// The extender, the device plugin and the inspector all charge through this
// or ChargesBySet.
func ChargesByGPU(reqs []ContainerRequest, gpuOf func(ContainerRequest) int) map[int]uint64 {
	return ChargesBySet(reqs, func(c ContainerRequest) GPUSet { return NewGPUSet(gpuOf(c)) })
}

// ChargesBySet is ChargesByGPU for containers that may span several GPUs: a
// container on a set of k GPUs counts its units / k on each of them (the
// contract splits evenly). With one-GPU sets it is ChargesByGPU.
func ChargesBySet(reqs []ContainerRequest, setOf func(ContainerRequest) GPUSet) map[int]uint64 {
	byGPU := map[int][]ContainerRequest{}
	for _, c := range reqs {
		s := setOf(c)
		share := c
		if k := uint64(s.Len()); k > 1 {
			share.Units = c.Units / k
		}
		for _, g := range s.Indices() {
			byGPU[g] = append(byGPU[g], share)
		}
	}
	out := make(map[int]uint64, len(byGPU))
	for g, cs := range byGPU {
		out[g] = PodUnits(cs)
	}
	return out
}

// Charges returns the units the pod with this assignment and these container
// requests charges on each GPU (see ChargesBySet). Every container must have
// its GPUs by SetFor, and the allocation must charge no container that asks
// for nothing; otherwise it is an *AssignmentError, since accounting would
// drift.
func (p PodAssignment) Charges(reqs []ContainerRequest) (map[int]uint64, error) {
	regular, err := p.ContainerSets(reqs)
	if err != nil {
		return nil, err
	}
	initSets := map[int]GPUSet{}
	for _, c := range reqs {
		if c.Init {
			s, err := p.SetFor(c)
			if err != nil {
				return nil, err
			}
			initSets[c.Index] = s
		}
	}
	return ChargesBySet(reqs, func(c ContainerRequest) GPUSet {
		if c.Init {
			return initSets[c.Index]
		}
		return regular[c.Index]
	}), nil
}
