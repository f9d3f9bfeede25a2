package gpushare

import (
	"errors"
	"maps"
	"slices"
	"strconv"
)

// Multi-GPU assignments (issue 15). A pod the extender placed on several GPUs
// has one GPU set S: its allocation annotation lists, for every regular
// container asking for gpu-mem, every GPU of S with the container's units
// divided evenly; its init containers, which the annotation cannot name, run
// on S too; ALIYUN_COM_GPU_MEM_IDX is S's first GPU, so readers that know
// only the index still find the pod's first GPU.

// ContainerSet returns the GPUs and per-GPU units of container index c. ok
// is false when a has no entry for c. A container on several GPUs with
// unequal units is an *AssignmentError (ErrMultiGPUContainer): the contract
// splits a container evenly, and an uneven split cannot be limited per GPU.
func (a Allocation) ContainerSet(c int) (set GPUSet, per uint64, ok bool, err error) {
	gpus, ok := a[c]
	if !ok || len(gpus) == 0 {
		return 0, 0, false, nil
	}
	for _, g := range slices.Sorted(maps.Keys(gpus)) {
		u := gpus[g]
		if per != 0 && u != per {
			return 0, 0, true, &AssignmentError{Index: c, Reason: "allocation splits the container unevenly over GPUs " +
				formatInts(slices.Sorted(maps.Keys(gpus))) + ", a container gets the same units on each of its GPUs", Err: ErrMultiGPUContainer}
		}
		per = u
		set |= NewGPUSet(g)
	}
	return set, per, true, nil
}

// MultiSet returns the GPU set of a multi-GPU pod, or 0 when no container of
// the allocation spans several GPUs (a single-GPU or split pod). Containers
// on different sets, or an index annotation naming another GPU than the
// set's first, are an *AssignmentError (ErrAssignmentMismatch).
func (p PodAssignment) MultiSet() (GPUSet, error) {
	var set GPUSet
	containers := slices.Sorted(maps.Keys(p.Allocation))
	// The lowest container on several GPUs sets the pod's set, so a
	// mismatch always blames the same container.
	for _, c := range containers {
		if gpus := p.Allocation[c]; len(gpus) > 1 {
			set = setOf(gpus)
			break
		}
	}
	if set == 0 {
		return 0, nil
	}
	for _, c := range containers {
		if s := setOf(p.Allocation[c]); s != set {
			return 0, &AssignmentError{Index: c, Reason: "allocation puts it on GPUs " + s.String() + " and another container of its pod on " +
				set.String() + "; a container on several GPUs shares them with every container of its pod", Err: ErrAssignmentMismatch}
		}
	}
	if p.GPUIndex >= 0 && p.GPUIndex != set.First() {
		return 0, &AssignmentError{Index: -1, Reason: "the index annotation names GPU " + strconv.Itoa(p.GPUIndex) +
			", not the first of the pod's GPUs " + set.String(), Err: ErrAssignmentMismatch}
	}
	return set, nil
}

// setOf is the set of GPUs a container's allocation entry lists.
func setOf(gpus GPUUnits) GPUSet {
	var s GPUSet
	for g := range gpus {
		s |= NewGPUSet(g)
	}
	return s
}

// SetFor returns the GPUs container c must run on: its one GPU (GPUFor) for
// single-GPU and split pods, the pod's set (MultiSet) for multi-GPU pods, where a
// regular container's entry must hold its units split evenly over the set.
// Anything that cannot be decided is an *AssignmentError.
func (p PodAssignment) SetFor(c ContainerRequest) (GPUSet, error) {
	set, err := p.MultiSet()
	if err != nil {
		return 0, err
	}
	if set == 0 {
		g, err := p.GPUFor(c)
		if err != nil {
			return 0, err
		}
		return NewGPUSet(g), nil
	}
	mismatch := func(reason string) error {
		return &AssignmentError{Container: c.Name, Index: c.Index, Init: c.Init, Reason: reason, Err: ErrAssignmentMismatch}
	}
	if c.Units%uint64(set.Len()) != 0 {
		return 0, mismatch(uintString(c.Units) + " units do not divide evenly over GPUs " + set.String())
	}
	if c.Init {
		return set, nil
	}
	s, per, ok, err := p.Allocation.ContainerSet(c.Index)
	switch {
	case err != nil:
		var ae *AssignmentError
		if errors.As(err, &ae) {
			named := *ae
			named.Container = c.Name
			return 0, &named
		}
		return 0, err
	case !ok:
		return 0, mismatch("the allocation annotation has no entry for this container")
	case s != set:
		return 0, mismatch("the allocation puts it on GPUs " + s.String() + ", the pod's other containers on " + set.String())
	case per*uint64(set.Len()) != c.Units:
		return 0, mismatch("the allocation gives " + uintString(per) + " units on each of GPUs " + set.String() +
			", the container requests " + uintString(c.Units))
	}
	return set, nil
}

// ContainerSets maps each regular container of reqs that asks for gpu-mem
// (by index in pod.spec.containers) to its GPUs (SetFor), and, like
// ContainerGPUs, fails when the allocation charges a container that asks for
// nothing.
func (p PodAssignment) ContainerSets(reqs []ContainerRequest) (map[int]GPUSet, error) {
	out := map[int]GPUSet{}
	for _, r := range reqs {
		if r.Init {
			continue
		}
		s, err := p.SetFor(r)
		if err != nil {
			return nil, err
		}
		out[r.Index] = s
	}
	for _, c := range slices.Sorted(maps.Keys(p.Allocation)) {
		if _, ok := out[c]; !ok {
			return nil, &AssignmentError{Index: c, Reason: "the allocation charges a container that requests no gpu-mem", Err: ErrAssignmentMismatch}
		}
	}
	return out, nil
}

// AllocationForSet places every regular container of reqs on every GPU of
// set with its units divided evenly, the shape the extender writes for a
// multi-GPU pod; nil when no regular container asks for gpu-mem. Units must
// divide by set.Len() (PodMultiGPU checked it).
func AllocationForSet(reqs []ContainerRequest, set GPUSet) Allocation {
	var a Allocation
	n := uint64(set.Len())
	for _, r := range reqs {
		if r.Init || r.Units == 0 || n == 0 {
			continue
		}
		if a == nil {
			a = Allocation{}
		}
		per := GPUUnits{}
		for _, g := range set.Indices() {
			per[g] = r.Units / n
		}
		a[r.Index] = per
	}
	return a
}
