package usage

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Pod is what attribution needs of one pod on the node.
type Pod struct {
	UID       types.UID
	Namespace string
	Name      string
	// Containers maps each container's runtime ID (hex, without the
	// "containerd://" scheme) to its name, init and ephemeral ones included.
	Containers map[string]string
	// Slices maps container name → GPU index → the container's slice of
	// that GPU in bytes, from the pod's container-env record.
	Slices map[string]map[int]uint64
}

// PodOf reads p's container IDs from its status and its slices from its
// gpushare.io/container-env record (unitBytes per unit). A pod without a
// record has no slices; a malformed record is an error, and the pod's
// processes still count as used without a slice.
func PodOf(p *corev1.Pod, unitBytes uint64) (Pod, error) {
	out := Pod{UID: p.UID, Namespace: p.Namespace, Name: p.Name, Containers: map[string]string{}, Slices: map[string]map[int]uint64{}}
	for _, list := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, s := range list {
			if id := runtimeID(s.ContainerID); id != "" {
				out.Containers[id] = s.Name
			}
		}
	}
	raw, ok := p.Annotations[gpushare.AnnotationContainerEnv]
	if !ok {
		return out, nil
	}
	envs, err := gpushare.DecodeContainerEnvs(raw)
	if err != nil {
		return out, fmt.Errorf("pod %s/%s: slices unknown: %w", p.Namespace, p.Name, err)
	}
	for name, env := range envs {
		per := map[int]uint64{}
		for _, g := range env.Set().Indices() {
			per[g] = env.UnitsPerGPU() * unitBytes
		}
		out.Slices[name] = per
	}
	return out, nil
}

// runtimeID strips the runtime's scheme from a container status's ID
// ("containerd://<hex>"), lower-cased as package cgroup returns IDs.
func runtimeID(id string) string {
	if _, rest, ok := strings.Cut(id, "://"); ok {
		id = rest
	}
	return strings.ToLower(id)
}
