//go:build e2e

package e2e

import (
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// expectedEnv is the environment the race-free rule promises container r of pod p on the GPUs
// set, the first of devUnits units, on GPUs of tier: its signature (the whole ordered set for a
// multi-GPU container), the pod's compute share included where the tier can limit it.
func expectedEnv(p *corev1.Pod, reqs []gpushare.ContainerRequest, r gpushare.ContainerRequest, set gpushare.GPUSet, devUnits uint64, tier gpushare.Isolation) gpushare.ContainerEnv {
	env := gpushare.ContainerEnv{GPUIndex: set.First(), PodUnits: gpushare.PodUnits(reqs), ContainerUnits: r.Units, DevUnits: devUnits, Isolation: tier.OrNone()}
	if set.Len() > 1 {
		env.GPUs = set
	}
	if env.Isolation.Limits() {
		env.ComputePercent, _ = gpushare.PodComputePercent(p.Annotations)
	}
	return env
}

// missingGPUs lists the GPUs of set that node lacks, "" when it has them all.
func missingGPUs(node gpushare.NodeGPUs, set gpushare.GPUSet) string {
	var missing []string
	for _, g := range set.Indices() {
		if _, ok := node.GPU(g); !ok {
			missing = append(missing, strconv.Itoa(g))
		}
	}
	return strings.Join(missing, ",")
}
