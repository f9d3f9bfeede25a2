//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// extenderDown is how long TestExtenderUnreachable keeps the extender away after the pods have
// said why they wait.
const extenderDown = 5 * time.Second

// TestExtenderUnreachable stops the extender while pods arrive: they wait with the scheduler's
// reason naming the extender, and once it is back they are placed, none over-committing a GPU.
func TestExtenderUnreachable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	addr := "127.0.0.1:" + freeLoopbackPort(t)
	c, client, _, sizes := startBurstBed(t)
	ext := startExtender(t, addr, client)
	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{Extenders: []cluster.Extender{ourExtender("http://" + addr)}}); err != nil {
		t.Fatal(err)
	}
	ext.stop(t)

	const n = 20
	for i := range n {
		p := burstPod(i)
		p.Name = fmt.Sprintf("wait-%02d", i)
		if _, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Every pod says why it waits: the scheduler could not reach the extender.
	reason := func(p *corev1.Pod) string {
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				return c.Reason + ": " + c.Message
			}
		}
		return ""
	}
	var sample string
	pollUntil(t, waitLong, "every pod to report the unreachable extender", func() bool {
		l, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, p := range l.Items {
			if p.Spec.NodeName != "" {
				t.Fatalf("pod %s bound to %s while the extender was down", p.Name, p.Spec.NodeName)
			}
			r := reason(&p)
			if !strings.Contains(r, gpushare.ExtenderURLPrefix+"/filter") || !strings.Contains(r, "connection refused") {
				return false
			}
			sample = r
		}
		return len(l.Items) == n
	})
	t.Logf("while the extender is down, pods say: %s", sample)
	select {
	case <-ctx.Done():
		return
	case <-time.After(extenderDown): // the outage goes on; nothing is awaited here
	}

	back := time.Now()
	ext = startExtender(t, addr, client)
	t.Cleanup(func() { ext.stop(t) })
	var items []corev1.Pod
	err := cluster.Poll(ctx, 2*time.Minute, "every pod placed or judged unschedulable", func(ctx context.Context) (bool, error) {
		l, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		items = l.Items
		for _, p := range items {
			if p.Spec.NodeName == "" && unschedulable(&p) == "" {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	bound := 0
	for _, p := range items {
		if p.Spec.NodeName != "" {
			bound++
		} else if msg := unschedulable(&p); !strings.Contains(msg, "more than the largest healthy GPU") {
			t.Errorf("pod %s pending: %q", p.Name, msg)
		}
	}
	charges(t, items, sizes)
	t.Logf("extender back: %d of %d pods placed %v later (the rest fit no GPU), no GPU over-committed", bound, n, time.Since(back).Round(time.Millisecond))
}
