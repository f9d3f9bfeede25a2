package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/podsource"
	"github.com/gpushare/gpushare/plugin/usage"
)

// usageOptions are the flags of the usage loop (docs/usage.md).
type usageOptions struct {
	interval time.Duration
	grace    time.Duration
	procRoot string
}

// register adds the usage flags to fs.
func (o *usageOptions) register(fs *flag.FlagSet) {
	fs.DurationVar(&o.interval, "usage-interval", 0, "how often to read the GPU memory each container really uses (NVML's process lists, "+
		"each process mapped to its container through /proc/<pid>/cgroup: the DaemonSet needs hostPID, docs/usage.md); 0 reads nothing")
	fs.DurationVar(&o.grace, "usage-overuse-grace", usage.DefaultGrace, "how long a container must stay above its slice before a "+
		gpushare.EventReasonOverUse+" Event on its pod names it")
	fs.StringVar(&o.procRoot, "usage-proc-root", "/proc", "where the host's processes are seen (/proc with hostPID)")
}

// check validates the usage flags.
func (o *usageOptions) check() error {
	if o.interval != 0 && o.interval < time.Second {
		return fmt.Errorf("--usage-interval: %v is below a second (0 turns the loop off)", o.interval)
	}
	if o.grace <= 0 {
		return fmt.Errorf("--usage-overuse-grace: %v is not positive", o.grace)
	}
	if !filepath.IsAbs(o.procRoot) || filepath.Clean(o.procRoot) != o.procRoot {
		return fmt.Errorf("--usage-proc-root: %q is not a clean absolute path", o.procRoot)
	}
	return nil
}

// startUsage runs the usage loop until ctx ends, on its own watch of the
// node's pods (the same in both modes); the returned wait blocks until it
// has stopped. With --usage-interval 0 it starts nothing.
func startUsage(ctx context.Context, o options, logger *zap.Logger, client kubernetes.Interface, lib nvml.Library, metrics *usage.Metrics) (func(), error) {
	if o.usage.interval == 0 {
		return func() {}, nil
	}
	log := logger.Named("usage")
	pods := podsource.New(client, o.node, log)
	events, stopEvents := manager.StartEventRecorder(ctx, client)
	loop, err := usage.New(usage.Config{
		GPUs: lib, Pods: pods.Pods, ProcRoot: o.usage.procRoot, Unit: o.unit, Interval: o.usage.interval, Grace: o.usage.grace,
		Metrics: metrics, Events: events, Publish: usage.NodePublisher(client, o.node, fieldManager(o)), Logger: log,
	})
	if err != nil {
		stopEvents()
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer stopEvents()
		// Started here, not before returning: the plugin serves its GPUs
		// while the API server is away; only the usage waits for it.
		if err := pods.Start(ctx); err != nil {
			log.Error("usage loop not started: watch the node's pods", zap.Error(err))
			return
		}
		defer pods.Shutdown()
		loop.Run(ctx)
	}()
	log.Info("reading the GPUs' use", zap.Duration("interval", o.usage.interval), zap.Duration("overUseGrace", o.usage.grace),
		zap.String("procRoot", o.usage.procRoot))
	return func() { <-done }, nil
}

// fieldManager names the program's writes by its mode, as its other writes are named.
func fieldManager(o options) string {
	if o.dra.mode == modeDRA {
		return "gpushare-dra-driver"
	}
	return "gpushare-device-plugin"
}
