package cluster

import (
	"context"
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeSpec describes a Node object without a kubelet, for scheduler tests at scale: pods bound to
// it stay in phase Pending, which is all a scheduling test needs.
type NodeSpec struct {
	Name string
	// Address is the node's InternalIP; empty means 127.0.0.1.
	Address string
	// Extended resources in the node's capacity and allocatable, e.g. aliyun.com/gpu-mem: 32.
	Resources   map[corev1.ResourceName]int64
	Labels      map[string]string
	Annotations map[string]string
}

// CreateNodes creates Node objects with Ready status, plenty of CPU, memory and pod room, and the
// given extended resources (a Node created through the API keeps its .status). It uses up to
// 16 requests at once.
func (c *Cluster) CreateNodes(ctx context.Context, specs []NodeSpec) error {
	return Parallel(ctx, 16, len(specs), func(ctx context.Context, i int) error {
		if _, err := c.client.CoreV1().Nodes().Create(ctx, nodeObject(specs[i]), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create node %s: %w", specs[i].Name, err)
		}
		return nil
	})
}

func nodeObject(spec NodeSpec) *corev1.Node {
	addr := spec.Address
	if addr == "" {
		addr = "127.0.0.1"
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
		corev1.ResourcePods:   resource.MustParse(strconv.Itoa(1000)),
	}
	for name, v := range spec.Resources {
		capacity[name] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Labels: spec.Labels, Annotations: spec.Annotations},
		Status: corev1.NodeStatus{
			Capacity:    capacity,
			Allocatable: capacity.DeepCopy(),
			Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "BedNode",
				LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(),
			}},
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}},
		},
	}
}
