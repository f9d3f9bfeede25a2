package dra

import (
	"context"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// TestWatchHealthStatus: the stream reports every GPU healthy at once, a fault on the next report
// after it (woken by the change, not by the resend timer), and ends when the kubelet closes it.
func TestWatchHealthStatus(t *testing.T) {
	base := simulated(t, "simulated:dgxh100")
	drv := newTestDriver(t, base, newDirs(t), isolation.Status{Tier: gpushare.IsolationNone})
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	ended := make(chan error, 1)
	go func() { ended <- drv.WatchHealthStatus(ctx, reports) }()

	first := <-reports
	if len(first.Devices) != len(base) || !drv.Registered() {
		t.Fatalf("first report of %d devices (registered %v); want all %d", len(first.Devices), drv.Registered(), len(base))
	}
	for _, d := range first.Devices {
		if d.Health != kubeletplugin.HealthStatusHealthy || d.PoolName != testNode || d.HealthCheckTimeout != healthLease {
			t.Errorf("device %+v: want healthy in pool %s with a %s lease", d, testNode, healthLease)
		}
	}
	if _, _, err := drv.node.health(nvml.HealthEvent{UUID: base[3].UUID, Xid: 79, Cause: nvml.CauseFatal, Reason: "critical Xid 79"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-reports:
		sick := deviceOf(t, base[3])
		for _, d := range r.Devices {
			if want := d.DeviceName == sick; (d.Health == kubeletplugin.HealthStatusUnhealthy) != want || (want && d.Message != gpushare.DRATaintValueLost) {
				t.Errorf("after Xid 79 on GPU 3: device %s %s %q", d.DeviceName, d.Health, d.Message)
			}
		}
	case <-time.After(healthResend / 2):
		t.Fatalf("no report within %s of the fault: the change did not wake the stream", healthResend/2)
	}
	cancel() // no reader any more: the stream must still end
	if err := <-ended; err != nil {
		t.Errorf("stream ended with %v", err)
	}
}
