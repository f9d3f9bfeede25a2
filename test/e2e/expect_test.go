//go:build e2e

package e2e

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// expectedEnv is the environment the race-free rule promises container r of pod p on GPU gpu of
// devUnits units, on a GPU of tier: its signature, the pod's compute share included where the tier
// can limit it.
func expectedEnv(p *corev1.Pod, reqs []gpushare.ContainerRequest, r gpushare.ContainerRequest, gpu int, devUnits uint64, tier gpushare.Isolation) gpushare.ContainerEnv {
	env := gpushare.ContainerEnv{GPUIndex: gpu, PodUnits: gpushare.PodUnits(reqs), ContainerUnits: r.Units, DevUnits: devUnits, Isolation: tier.OrNone()}
	if env.Isolation.Limits() {
		env.ComputePercent, _ = gpushare.PodComputePercent(p.Annotations)
	}
	return env
}
