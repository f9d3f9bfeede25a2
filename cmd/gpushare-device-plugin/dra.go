package main

import (
	"context"
	"flag"
	"fmt"
	"path/filepath"

	"go.uber.org/zap"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/dra"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// The program's modes: a node runs one (KEP-5004 forbids a device plugin
// and a DRA driver serving one resource on one node).
const (
	modeDevicePlugin = "device-plugin"
	modeDRA          = "dra"
)

// draOptions are the flags of -mode=dra.
type draOptions struct {
	mode         string
	pluginDir    string
	registrarDir string
}

// register adds the mode flags to fs.
func (o *draOptions) register(fs *flag.FlagSet) {
	fs.StringVar(&o.mode, "mode", modeDevicePlugin, "what the program serves: "+modeDevicePlugin+" (aliyun.com/gpu-mem through the kubelet's device-plugin API) or "+
		modeDRA+" (the DRA driver "+gpushare.DRADriverName+": each GPU's memory as consumable capacity, docs/dra.md)")
	fs.StringVar(&o.pluginDir, "dra-plugin-dir", gpushare.DefaultDRAPluginDir, "with -mode=dra, the driver's directory (its dra.sock and checkpoint), the same path on the host")
	fs.StringVar(&o.registrarDir, "dra-registrar-dir", gpushare.DefaultDRARegistrarDir, "with -mode=dra, the kubelet's plugin registration directory")
}

// check validates the mode flags against the rest.
func (o *draOptions) check(all options) error {
	switch o.mode {
	case modeDevicePlugin:
		return nil
	case modeDRA:
	default:
		return fmt.Errorf("--mode: %q is neither %s nor %s", o.mode, modeDevicePlugin, modeDRA)
	}
	for name, p := range map[string]string{"--dra-plugin-dir": o.pluginDir, "--dra-registrar-dir": o.registrarDir} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("%s: %q is not a clean absolute path", name, p)
		}
	}
	if all.deviceList.Strategies.Includes(gpushare.DeviceListVolumeMounts) {
		return fmt.Errorf("--device-list-strategy volume-mounts is not available with --mode=dra: a claim's GPUs reach the runtime by CDI (cdi-cri) or NVIDIA_VISIBLE_DEVICES (envvar)")
	}
	return nil
}

// serveDRA runs the DRA driver until ctx ends, on the API client, NVML
// library and tier configuration the device-plugin mode would use.
func serveDRA(ctx context.Context, o options, logger *zap.Logger, client kubernetes.Interface, lib nvml.Library, tiers manager.IsolationConfig) error {
	s := o.deviceList.Strategies
	logger.Info("starting in DRA mode", zap.String("node", o.node), zap.String("backend", o.backend), zap.Stringer("unit", o.unit),
		zap.String("pluginDir", o.dra.pluginDir), zap.String("cdiDir", o.cdiSpecDir), zap.String("isolation", string(o.isolation.tier)))
	err := dra.Run(ctx, dra.Config{
		Node: o.node, Client: client, Library: lib, Unit: o.unit,
		PluginDir: o.dra.pluginDir, RegistrarDir: o.dra.registrarDir, CDIDir: o.cdiSpecDir,
		CDIGPUs: s.Includes(gpushare.DeviceListCDICRI) || s.Includes(gpushare.DeviceListCDIAnnotations), IDs: o.deviceList.IDs,
		HealthCheck: o.healthCheck, HealthQuietPeriod: o.quiet, Health: nvml.HealthOptions{FatalXids: o.fatalXids},
		Isolation: dra.IsolationConfig{Tier: tiers.Tier, Paths: tiers.Paths, MPS: tiers.MPS, ProbeEvery: tiers.ProbeEvery},
		Logger:    logger,
	})
	logger.Info("stopped")
	return err
}
