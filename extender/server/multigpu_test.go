package server

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// multiGPUPod is gpuPod labelled to spread each container over count GPUs.
func multiGPUPod(name, count string, units ...int64) *corev1.Pod {
	p := gpuPod(name, units...)
	p.Labels = map[string]string{gpushare.LabelPodGPUCount: count}
	return p
}

// TestFilterMultiGPUDivision: a container whose units do not divide by the
// pod's gpu-count fails every node, unresolvably, naming the container; a
// multiple of the count passes the nodes with enough GPUs.
func TestFilterMultiGPUDivision(t *testing.T) {
	e := newEnv(t, gpuNode("n1", 32, 2), gpuNode("n2", 64, 4), gpuNode("one", 16, 1))
	nodes := []string{"n1", "n2", "one"}

	bad := multiGPUPod("odd", "2", 3)
	res := e.filter(bad, nodes...)
	if res.NodeNames != nil && len(*res.NodeNames) != 0 {
		t.Fatalf("3 units over 2 GPUs passed %v", *res.NodeNames)
	}
	if len(res.FailedNodes) != 0 {
		t.Fatalf("failed resolvably: %v; want every node unresolvable", res.FailedNodes)
	}
	for _, n := range nodes {
		reason, ok := res.FailedAndUnresolvableNodes[n]
		if !ok {
			t.Fatalf("node %s not failed unresolvably: %+v", n, res)
		}
		if !strings.Contains(reason, `container "c0"`) || !strings.Contains(reason, "do not divide") {
			t.Errorf("node %s: reason %q; want it to name container \"c0\" and say its units do not divide", n, reason)
		}
	}

	good := multiGPUPod("even", "2", 4)
	res = e.filter(good, nodes...)
	if res.NodeNames == nil || !slices.Equal(*res.NodeNames, []string{"n1", "n2"}) {
		t.Fatalf("4 units over 2 GPUs passed %v; want n1, n2 (failed %v, unresolvable %v)", res.NodeNames, res.FailedNodes, res.FailedAndUnresolvableNodes)
	}
	if reason := res.FailedAndUnresolvableNodes["one"]; !strings.Contains(reason, "the node has 1") {
		t.Errorf("one-GPU node: reason %q; want unresolvable, the node has 1 GPU", reason)
	}
}
