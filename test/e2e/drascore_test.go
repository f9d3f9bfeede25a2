//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/test/cluster"
)

// TestDRAScoredPacking: gpushare-scheduler, configured as manifests/scheduler-plugin ships it,
// scores DRA nodes for gpu-mem claims by where kube-scheduler's allocator will put them. On two
// DRA nodes of one 80 GiB GPU each, six pods of 8 GiB claims created at once all land on one node
// under the shipped bestfit policy. kube-scheduler's own scores see no DRA capacity: with the DRA
// score turned off (PreScore skipping every DRA pod; run 2026-12-05) the bestfit round put three
// on each node (NodeResourcesFit's LeastAllocated on the pods' default requests) and this test
// failed. The second round runs the plugin's spread policy, three and three: the policy reaches the
// DRA score as it reaches the extender's.
func TestDRAScoredPacking(t *testing.T) {
	t.Parallel()
	cfg, dir := pluginScheduler(t)
	profiles := cfg.Profiles
	if !bytes.Contains(profiles, []byte(`"policy":"bestfit"`)) {
		t.Fatalf("the shipped profile sets no bestfit policy: %s", profiles)
	}
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	b := &draBed{c: c, client: c.Client(), nodes: map[string]*draNode{}, claimNS: "default"}
	applyDRAObjects(t, c)
	grantPluginRole(t, c, dir)
	for _, name := range []string{"dra-a", "dra-b"} {
		b.addNodeOn(t, name, oneGPU{simulator(t, "simulated:dgxh100")}, nil)
	}
	b.createTemplates(t, claimTemplate("mem-8", 8, 0))

	round := func(policy string) map[string]int {
		t.Helper()
		prof := bytes.ReplaceAll(profiles, []byte(`"policy":"bestfit"`), []byte(`"policy":"`+policy+`"`))
		cfg.Profiles = prof
		if err := c.StartScheduler(t.Context(), cfg); err != nil {
			t.Fatal(err)
		}
		var names []string
		for i := range 6 {
			names = append(names, fmt.Sprintf("%s-%d", policy, i))
			b.createPods(t, claimPod(names[i], "mem-8", ""))
		}
		b.waitPodsRunning(t, 2*waitLong, names...)
		perNode := map[string]int{}
		for _, n := range names {
			p, err := b.client.CoreV1().Pods(b.claimNS).Get(t.Context(), n, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			perNode[p.Spec.NodeName]++
		}
		t.Logf("%s: pods per node %v", policy, perNode)
		// The next round starts on empty GPUs: every claim released and deleted.
		deleteAndWaitClaimsGone(t, b, b.claimNS, names...)
		return perNode
	}
	if got := round("bestfit"); len(got) != 1 {
		t.Errorf("bestfit spread six 8 GiB claims over the nodes %v: the DRA score did not pack them", got)
	}
	if got := round("spread"); got["dra-a"] != 3 || got["dra-b"] != 3 {
		t.Errorf("spread placed the six claims %v, want three on each node: the score does not decide the node", got)
	}
}
