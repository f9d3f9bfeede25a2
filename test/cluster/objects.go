package cluster

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// WaitForPod polls the pod until cond holds or timeout passes; it returns the last pod seen.
// The failure names what was awaited and the pod's phase and conditions.
func (c *Cluster) WaitForPod(ctx context.Context, namespace, name string, timeout time.Duration, what string, cond func(*corev1.Pod) bool) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := waitUntil(ctx, timeout, fmt.Sprintf("pod %s/%s %s", namespace, name, what), nil, func(ctx context.Context) (bool, error) {
		p, err := c.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		if cond(p) {
			return true, nil
		}
		return false, fmt.Errorf("phase %s, node %q, conditions %v", p.Status.Phase, p.Spec.NodeName, p.Status.Conditions)
	})
	return pod, err
}

// WaitForNode polls the node until cond holds or timeout passes; it returns the last node seen.
func (c *Cluster) WaitForNode(ctx context.Context, name string, timeout time.Duration, what string, cond func(*corev1.Node) bool) (*corev1.Node, error) {
	var node *corev1.Node
	err := waitUntil(ctx, timeout, fmt.Sprintf("node %s %s", name, what), nil, func(ctx context.Context) (bool, error) {
		n, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		node = n
		if cond(n) {
			return true, nil
		}
		return false, fmt.Errorf("capacity %v, allocatable %v", n.Status.Capacity, n.Status.Allocatable)
	})
	return node, err
}

// PodRunning is a WaitForPod condition.
func PodRunning(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning }

// PodBound is a WaitForPod condition.
func PodBound(p *corev1.Pod) bool { return p.Spec.NodeName != "" }

// Allocatable is a WaitForNode condition: the node's allocatable amount of resource equals want.
func Allocatable(resource corev1.ResourceName, want int64) func(*corev1.Node) bool {
	return func(n *corev1.Node) bool {
		q, ok := n.Status.Allocatable[resource]
		if !ok {
			return want == 0
		}
		return q.Value() == want
	}
}
