package usage

import (
	"slices"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/usage/cgroup"
)

// Sample is one reading of the node's GPUs attributed to containers.
type Sample struct {
	GPUs []GPUUse
	// Containers are sorted by namespace, pod, container, then GPU: every
	// container with a process on a GPU, and every container with a slice
	// of a GPU it has no process on (using 0).
	Containers []ContainerUse
}

// GPUUse is one GPU's reading.
type GPUUse struct {
	Index int
	UUID  string
	// UsedBytes and TotalBytes are NVML's memory info.
	UsedBytes, TotalBytes uint64
	// UtilizationPercent is -1 when the GPU does not report it.
	UtilizationPercent int
	// UnattributedBytes is what processes used that no container of a pod
	// on the node accounts for.
	UnattributedBytes uint64
}

// ContainerUse is one container's processes on one GPU.
type ContainerUse struct {
	Namespace, Pod, Container string
	GPU                       int
	UUID                      string
	UsedBytes                 uint64
	// SliceBytes is the container's slice of the GPU; 0 when it has none.
	SliceBytes uint64
}

// Over reports whether the container uses more than its slice.
func (c ContainerUse) Over() bool { return c.SliceBytes > 0 && c.UsedBytes > c.SliceBytes }

// key identifies a container on a GPU.
type key struct {
	namespace, pod, container string
	gpu                       int
}

func (c ContainerUse) key() key { return key{c.Namespace, c.Pod, c.Container, c.GPU} }

// Attribute charges each process of readings to the container owners names
// for its PID, and lists every slice of pods beside what its container uses.
// A process whose memory NVML cannot read counts for nothing; one without an
// owner, or whose pod or container is not among pods, is unattributed.
func Attribute(readings []nvml.Usage, owners map[uint32]cgroup.Owner, pods []Pod) Sample {
	byUID := make(map[string]*Pod, len(pods))
	for i := range pods {
		byUID[string(pods[i].UID)] = &pods[i]
	}
	uuidOf := map[int]string{}
	uses := map[key]*ContainerUse{}
	var s Sample
	for _, r := range readings {
		uuidOf[r.Index] = r.UUID
		g := GPUUse{Index: r.Index, UUID: r.UUID, UsedBytes: r.UsedBytes, TotalBytes: r.TotalBytes, UtilizationPercent: r.UtilizationPercent}
		for _, p := range r.Processes {
			if !p.UsedKnown {
				continue
			}
			pod, container, ok := ownerOf(owners, byUID, p.PID)
			if !ok {
				g.UnattributedBytes += p.UsedBytes
				continue
			}
			k := key{pod.Namespace, pod.Name, container, r.Index}
			if uses[k] == nil {
				uses[k] = &ContainerUse{Namespace: pod.Namespace, Pod: pod.Name, Container: container, GPU: r.Index, UUID: r.UUID,
					SliceBytes: pod.Slices[container][r.Index]}
			}
			uses[k].UsedBytes += p.UsedBytes
		}
		s.GPUs = append(s.GPUs, g)
	}
	for _, pod := range pods {
		for container, per := range pod.Slices {
			for gpu, bytes := range per {
				k := key{pod.Namespace, pod.Name, container, gpu}
				if _, read := uuidOf[gpu]; read && uses[k] == nil {
					uses[k] = &ContainerUse{Namespace: pod.Namespace, Pod: pod.Name, Container: container, GPU: gpu, UUID: uuidOf[gpu], SliceBytes: bytes}
				}
			}
		}
	}
	for _, u := range uses {
		s.Containers = append(s.Containers, *u)
	}
	slices.SortFunc(s.Containers, func(a, b ContainerUse) int { return gpushare.CompareContainerUsage(a.ref(), b.ref()) })
	return s
}

// ownerOf finds the pod and container name of pid.
func ownerOf(owners map[uint32]cgroup.Owner, byUID map[string]*Pod, pid uint32) (*Pod, string, bool) {
	o, ok := owners[pid]
	if !ok {
		return nil, "", false
	}
	pod := byUID[o.PodUID]
	if pod == nil {
		return nil, "", false
	}
	name, ok := pod.Containers[o.ContainerID]
	return pod, name, ok
}

// ref is c's names and GPU in the annotation's form, without figures.
func (c ContainerUse) ref() gpushare.ContainerUsage {
	return gpushare.ContainerUsage{Namespace: c.Namespace, Pod: c.Pod, Container: c.Container, GPU: c.GPU}
}

// roundDiv is n/d rounded to the nearest whole number.
func roundDiv(n, d uint64) uint64 { return n/d + (n%d)*2/d }
