package manager_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/manager"
)

// A restarted kubelet admits its pods again at once, and refuses every one that needs gpu-mem
// until the plugin has registered again ("no healthy devices present"). So registering again
// must not wait for anything else the plugin is doing: here a pod's record PATCH hangs (an API
// server holding its answer, as the soak's proxies do for 3 s) while the attribution holds the
// allocator's lock to write it.
func TestReRegistersWhileARecordWriteHangs(t *testing.T) {
	ctx := t.Context()
	pr, sock := startPodResources(t)
	e := run(t, "simulated:dgxh100", func(c *manager.Config) { c.PodResourcesSocket = sock })
	e.kubelet.waitRegister(t)
	if _, err := e.client.CoreV1().Pods("default").Create(ctx, gpuPod("slow", 8, 2, 80), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writing, release := make(chan struct{}, 1), make(chan struct{})
	defer close(release)
	e.patchFaults.Set(func(pod string) error {
		if pod == "slow" {
			select {
			case writing <- struct{}{}:
			default:
			}
			<-release
		}
		return nil
	})
	req := allocReq(8)
	if _, err := e.plugin(t).Allocate(ctx, req); err != nil {
		t.Fatal(err)
	}
	pr.hold("default/slow/main", req.ContainerRequests[0].DevicesIds)
	select {
	case <-writing:
	case <-time.After(10 * time.Second):
		t.Fatal("the answer's record was never written")
	}
	k := restartKubelet(t, e)
	select {
	case <-k.got:
	case <-time.After(3 * time.Second):
		t.Fatal("the plugin did not register with the restarted kubelet while a record write hung")
	}
}
