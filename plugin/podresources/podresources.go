// Package podresources asks the kubelet's pod-resources API which container
// holds which device. The kubelet's Allocate call never names the pod it is
// for; after answering, the device plugin learns here whose container the
// devices went to, so what it records on pods is what the kubelet did.
package podresources

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultSocket is where the kubelet serves the pod-resources API.
const DefaultSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// Holder is the container a device is allocated to.
type Holder struct {
	Namespace, Pod, Container string
}

// Client lists device holders through one connection, which gRPC re-dials
// by itself after a kubelet restart.
type Client struct {
	conn *grpc.ClientConn
	api  podresourcesv1.PodResourcesListerClient
}

// New returns a client of the socket at path; it connects lazily.
func New(path string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("pod-resources socket %s: %w", path, err)
	}
	return &Client{conn: conn, api: podresourcesv1.NewPodResourcesListerClient(conn)}, nil
}

// Close releases the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Allocations is the kubelet's pod-resources answer for one resource.
type Allocations struct {
	// Holders is, for every device of the resource the kubelet has
	// allocated, the container holding it.
	Holders map[string]Holder
	// Pods are the pods the kubelet lists, "namespace/name": a pod listed
	// whose container holds nothing has no devices in the kubelet's books.
	Pods map[string]bool
}

// Holders lists what the kubelet has allocated of resource.
func (c *Client) Holders(ctx context.Context, resource string) (Allocations, error) {
	resp, err := c.api.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return Allocations{}, fmt.Errorf("pod-resources List: %w", err)
	}
	out := Allocations{Holders: map[string]Holder{}, Pods: map[string]bool{}}
	for _, pod := range resp.GetPodResources() {
		out.Pods[pod.GetNamespace()+"/"+pod.GetName()] = true
		for _, ctr := range pod.GetContainers() {
			for _, d := range ctr.GetDevices() {
				if d.GetResourceName() != resource {
					continue
				}
				for _, id := range d.GetDeviceIds() {
					out.Holders[id] = Holder{Namespace: pod.GetNamespace(), Pod: pod.GetName(), Container: ctr.GetName()}
				}
			}
		}
	}
	return out, nil
}
