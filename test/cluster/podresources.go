package cluster

import (
	"context"
	"sort"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// ContainerDevices names one container of one pod.
type ContainerDevices struct {
	Namespace, Pod, Container string
}

// PodResources asks the kubelet's pod-resources API (what monitoring agents use) which devices of
// resource each container holds. Device IDs are sorted.
func (k *Kubelet) PodResources(ctx context.Context, resource string) (map[ContainerDevices][]string, error) {
	conn, err := grpc.NewClient("unix://"+k.PodResourcesSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := podresourcesv1.NewPodResourcesListerClient(conn).List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return nil, err
	}
	out := map[ContainerDevices][]string{}
	for _, pod := range resp.GetPodResources() {
		for _, ctr := range pod.GetContainers() {
			var ids []string
			for _, d := range ctr.GetDevices() {
				if d.GetResourceName() == resource {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
			if len(ids) > 0 {
				sort.Strings(ids)
				out[ContainerDevices{pod.GetNamespace(), pod.GetName(), ctr.GetName()}] = ids
			}
		}
	}
	return out, nil
}
