package dra

import (
	"context"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpushare/gpushare/plugin/dra/slice"
)

// The kubelet treats a device's health as unknown when no report refreshed
// it within its lease; the driver re-sends well within it, and at once on
// every change.
const (
	healthLease  = 30 * time.Second
	healthResend = 10 * time.Second
)

// WatchHealthStatus implements kubeletplugin.DRAPlugin: the kubelet opens
// this stream once it accepted the registration (Registered), and puts
// each device's health into the pods' allocatedResourcesStatus. It gets
// every GPU's health at once, after every change of the node's state, and
// every healthResend otherwise, until the kubelet closes the stream.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	d.kubeletConnected.Store(true)
	resend := time.NewTicker(healthResend)
	defer resend.Stop()
	for {
		select {
		case reports <- d.healthReport(time.Now()):
		case <-ctx.Done():
			return nil
		}
		select {
		case <-d.node.HealthChanged():
		case <-resend.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// healthReport is every published GPU's health now: Unhealthy with the
// taint's value (the fault) as its message, Healthy otherwise.
func (d *Driver) healthReport(now time.Time) kubeletplugin.DeviceHealthReport {
	var r kubeletplugin.DeviceHealthReport
	for _, g := range d.node.publish() {
		name, err := slice.DeviceName(g.UUID)
		if err != nil {
			continue // never published either
		}
		h := kubeletplugin.DeviceHealth{PoolName: d.pool, DeviceName: name, Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: now, HealthCheckTimeout: healthLease}
		if g.Fault != nil {
			h.Health, h.Message = kubeletplugin.HealthStatusUnhealthy, g.Fault.Value
		}
		r.Devices = append(r.Devices, h)
	}
	return r
}
