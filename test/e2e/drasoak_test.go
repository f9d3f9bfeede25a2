//go:build e2e

package e2e

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpushare/gpushare/plugin/dra/store"
)

var (
	draSoakDuration = flag.Duration("dra-soak", 75*time.Second, "how long TestSoakDRA churns claim pods and restarts drivers and kubelets")
	draSoakSeed     = flag.Uint64("dra-soak-seed", 0, "TestSoakDRA's random seed; 0 picks one from the clock (it is logged)")
)

// draSoakSizes are the claims' sizes in GiB: from a sliver to a whole H100.
var draSoakSizes = []int64{4, 8, 16, 24, 40, 80}

// TestSoakDRA is the soak's DRA round: on two nodes of 8 × H100 80GB run by our DRA driver and the
// kubelet's DRA manager, pods with claims of 4 to 80 GiB are created and deleted continuously while
// a driver is restarted or a kubelet killed and started again every 4–8 s. A checker verifies every
// second that no GPU's allocated claims exceed its memory, that no driver has prepared more on a
// GPU than it has, and that every claim a driver has prepared is prepared on the devices the
// scheduler allocated to it. At the end, with churn and faults stopped: every pod runs or is pending
// with the scheduler's reason; every running container has its claim's GPU and memory; and each
// driver's checkpoint holds exactly the claims of the pods running on its node, once the kubelet
// has unprepared what ended while it was down.
func TestSoakDRA(t *testing.T) {
	t.Parallel()
	seed := *draSoakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("TestSoakDRA seed %d (rerun with -dra-soak-seed %d), for %v", seed, seed, *draSoakDuration)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := startDRABed(t)
	b.kubeletAPILimits = true
	nodes := []string{"soak-a", "soak-b"}
	for _, n := range nodes {
		b.addNode(t, n, "simulated:dgxh100", nil)
	}
	for _, gib := range draSoakSizes {
		b.createTemplates(t, claimTemplate(fmt.Sprintf("soak-%d", gib), gib, 0))
	}

	s := &draSoak{b: b, rng: rng, live: map[string]time.Time{}}
	deadline := time.Now().Add(*draSoakDuration)
	var wg sync.WaitGroup
	wg.Go(func() { s.churn(t, deadline) })
	// Checks every second and faults every 4–8 s, in this goroutine: both may fail the test.
	check := time.NewTicker(time.Second)
	defer check.Stop()
	faults := map[string]int{}
	nextFault := time.After(s.faultGap())
	for time.Now().Before(deadline) {
		select {
		case <-check.C:
			s.check(t)
		case <-nextFault:
			faults[s.fault(t, nodes)]++
			nextFault = time.After(s.faultGap())
		}
	}
	wg.Wait()
	t.Logf("faults: %v; pods created %d; checks that found a node's slice missing: %d", faults, s.created, s.slicesMissing)

	s.settle(t, nodes)
}

// draSoak is the churn's state.
type draSoak struct {
	b       *draBed
	mu      sync.Mutex
	rng     *rand.Rand
	live    map[string]time.Time // pod: when to delete it
	created int
	// slicesMissing counts the checks that found an allocated device in no slice.
	slicesMissing int
}

func (s *draSoak) intn(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rng.IntN(n)
}

// churn creates a pod every 150 ms with a claim of a random size and a lifetime of 2–8 s, and
// deletes pods whose lifetime ended, until deadline.
func (s *draSoak) churn(t *testing.T, deadline time.Time) {
	tick := time.NewTicker(150 * time.Millisecond)
	defer tick.Stop()
	for now := range tick.C {
		if now.After(deadline) {
			return
		}
		name := fmt.Sprintf("soak-%04d", s.created)
		gib := draSoakSizes[s.intn(len(draSoakSizes))]
		p := claimPod(name, fmt.Sprintf("soak-%d", gib), "")
		if _, err := s.b.client.CoreV1().Pods(s.b.claimNS).Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Errorf("create %s: %v", name, err)
			return
		}
		s.created++
		s.mu.Lock()
		s.live[name] = now.Add(2*time.Second + time.Duration(s.rng.IntN(6000))*time.Millisecond)
		var due []string
		for n, at := range s.live {
			if now.After(at) {
				due = append(due, n)
				delete(s.live, n)
			}
		}
		s.mu.Unlock()
		for _, n := range due {
			if err := s.b.client.CoreV1().Pods(s.b.claimNS).Delete(t.Context(), n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s: %v", n, err)
			}
		}
	}
}

func (s *draSoak) faultGap() time.Duration {
	return time.Duration(4000+s.intn(4000)) * time.Millisecond
}

// fault restarts a random node's driver, or kills and starts its kubelet, and names what it did.
func (s *draSoak) fault(t *testing.T, nodes []string) string {
	t.Helper()
	n := s.b.nodes[nodes[s.intn(len(nodes))]]
	if s.intn(2) == 0 {
		n.driver.stop(t)
		n.driver.start(t)
		return "driver restart"
	}
	n.kubelet.Kill()
	if err := n.kubelet.Start(t.Context()); err != nil {
		t.Fatalf("start kubelet %s again: %v", n.kubelet.Name(), err)
	}
	return "kubelet kill"
}

// check verifies the invariants that hold at every moment.
func (s *draSoak) check(t *testing.T) {
	t.Helper()
	// A restarting kubelet deletes its node's slices and the driver publishes them again at once;
	// a check may fall in between: counted, not an over-commit.
	if len(s.b.auditPublishedClaims(t)) > 0 {
		s.slicesMissing++
	}
	allocated := s.allocatedDevices(t)
	for name := range s.b.nodes {
		prepared := s.prepared(t, name)
		perGPU := map[string]uint64{}
		for uid, c := range prepared {
			for _, sh := range c.Shares {
				perGPU[sh.Device] += sh.Units
				if devs, ok := allocated[uid]; ok && !devs[name+"/"+sh.Device] {
					t.Errorf("driver of %s prepared claim %s on %s, which the scheduler did not allocate it (%v)", name, uid, sh.Device, devs)
				}
			}
		}
		for dev, units := range perGPU {
			if units > 80 {
				t.Errorf("driver of %s has prepared %d GiB on %s, which has 80", name, units, dev)
			}
		}
	}
}

// allocatedDevices maps each allocated claim to its devices, as node/device.
func (s *draSoak) allocatedDevices(t *testing.T) map[types.UID]map[string]bool {
	t.Helper()
	list, err := s.b.client.ResourceV1().ResourceClaims(s.b.claimNS).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[types.UID]map[string]bool{}
	for _, c := range list.Items {
		if c.Status.Allocation == nil {
			continue
		}
		out[c.UID] = map[string]bool{}
		for _, r := range c.Status.Allocation.Devices.Results {
			out[c.UID][r.Pool+"/"+r.Device] = true
		}
	}
	return out
}

// prepared reads node's driver checkpoint.
func (s *draSoak) prepared(t *testing.T, node string) map[types.UID]store.Claim {
	t.Helper()
	d := s.b.nodes[node].driver
	st, err := store.New(d.cfg.PluginDir, d.cfg.CDIDir)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := st.Load()
	if err != nil {
		t.Fatal(err)
	}
	return claims
}

// settle waits until every pod runs or is pending with the scheduler's reason, checks every
// running container, and waits until each driver's checkpoint is exactly its running claims.
func (s *draSoak) settle(t *testing.T, nodes []string) {
	t.Helper()
	var running []string
	waitFor(t, 3*waitLong, "every pod to run or be unschedulable", func() (bool, string) {
		pods, err := s.b.client.CoreV1().Pods(s.b.claimNS).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		running = running[:0]
		var stuck []string
		for _, p := range pods.Items {
			switch {
			case p.DeletionTimestamp != nil:
				stuck = append(stuck, p.Name+" terminating")
			case p.Status.Phase == corev1.PodRunning:
				running = append(running, p.Name)
			case unschedulable(&p) == "":
				stuck = append(stuck, p.Name+" "+podState(&p, nil))
			}
		}
		return len(stuck) == 0, fmt.Sprint(stuck)
	})
	want := map[string]map[types.UID]string{}
	for _, n := range nodes {
		want[n] = map[types.UID]string{}
	}
	for _, name := range running {
		a := s.b.podAllocation(t, name)
		want[a.node][a.claim.UID] = name
		for _, p := range s.b.checkClaimReachedContainer(t, name, int64(a.units[a.devices[0]])) {
			t.Error(p)
		}
	}
	t.Logf("settled: %d pods running", len(running))
	// The kubelet unprepares a claim whose pod ended while it was down in its reconcile loop (every
	// 60 s): allow two rounds.
	for _, n := range nodes {
		waitFor(t, 2*waitLong+10*time.Second, "the driver of "+n+" to hold exactly its running claims", func() (bool, string) {
			got := s.prepared(t, n)
			var diff []string
			for uid := range got {
				if _, ok := want[n][uid]; !ok {
					diff = append(diff, "extra "+string(uid))
				}
			}
			for uid, pod := range want[n] {
				if _, ok := got[uid]; !ok {
					diff = append(diff, "missing "+pod)
				}
			}
			return len(diff) == 0, fmt.Sprint(diff)
		})
	}
	s.check(t)
	s.b.auditClaims(t) // settled: every allocated device is published again
}
