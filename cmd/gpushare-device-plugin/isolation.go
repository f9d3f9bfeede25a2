package main

import (
	"flag"
	"fmt"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
	"github.com/gpushare/gpushare/plugin/manager"
	"github.com/gpushare/gpushare/plugin/mps"
	"github.com/gpushare/gpushare/plugin/nvml"
)

// Default host paths of the isolation tiers. MPS lives on /run (a tmpfs:
// the shared-memory directory must be memory, and nothing there outlives a
// reboot, when compute modes reset too) under a gpushare directory of its
// own, apart from NVIDIA's device plugin's /run/nvidia/mps. HAMi-core's
// library, preload file and lock directory are where HAMi installs them, so
// a node prepared for HAMi works unchanged.
const (
	defaultMPSPipeDir   = "/run/gpushare/mps/pipe"
	defaultMPSLogDir    = "/run/gpushare/mps/log"
	defaultMPSShmDir    = "/run/gpushare/mps/shm"
	defaultHAMiLibrary  = "/usr/local/vgpu/libvgpu.so"
	defaultHAMiPreload  = "/usr/local/vgpu/ld.so.preload"
	defaultHAMiLockDir  = "/tmp/vgpulock"
	defaultHAMiCacheDir = "/var/lib/gpushare/hami-cache"
)

// isolationOptions are the tier flags.
type isolationOptions struct {
	tier       gpushare.Isolation
	controlBin string
	mpsLogDir  string
	paths      isolation.Config
	probeEvery time.Duration
}

// tierFlag is a node's tier as a flag value.
type tierFlag struct{ t *gpushare.Isolation }

func (f tierFlag) String() string {
	if f.t == nil {
		return ""
	}
	return string(*f.t)
}

func (f tierFlag) Set(v string) error {
	t, err := gpushare.ParseIsolation(v)
	if err != nil {
		return err
	}
	*f.t = t
	return nil
}

// register adds the tier flags to fs.
func (o *isolationOptions) register(fs *flag.FlagSet) {
	o.tier = gpushare.IsolationNone
	fs.Var(tierFlag{&o.tier}, "isolation", "memory-isolation tier of this node's GPUs unless its label "+gpushare.LabelIsolation+
		" says otherwise: none, mps (NVIDIA MPS; the plugin runs the control daemon) or hami-core (the HAMi-core library, installed on the node)")
	fs.StringVar(&o.controlBin, "mps-control-bin", mps.DefaultControlBin, "the MPS control program the plugin runs in the mps tier (a path, or a name looked up in PATH)")
	fs.StringVar(&o.paths.MPSPipeDir, "mps-pipe-dir", defaultMPSPipeDir, "host directory of the MPS daemon's pipes and sockets, mounted in every mps container at the same path")
	fs.StringVar(&o.mpsLogDir, "mps-log-dir", defaultMPSLogDir, "host directory of the MPS daemon's logs and of the GPUs' previous compute modes")
	fs.StringVar(&o.paths.MPSShmDir, "mps-shm-dir", defaultMPSShmDir, "host directory that is the MPS daemon's /dev/shm (the plugin's container mounts it there), mounted at /dev/shm in every mps container")
	fs.StringVar(&o.paths.HAMiLibrary, "hami-core-library", defaultHAMiLibrary, "the HAMi-core library on the host, mounted read-only at "+gpushare.HAMiContainerLibrary+" in every hami-core container")
	fs.StringVar(&o.paths.HAMiPreload, "hami-core-preload", defaultHAMiPreload, "host file naming "+gpushare.HAMiContainerLibrary+", mounted read-only at "+gpushare.HAMiContainerPreload+" in every hami-core container")
	fs.StringVar(&o.paths.HAMiLockDir, "hami-core-lock-dir", defaultHAMiLockDir, "HAMi-core's lock directory on the host, shared by every hami-core container at "+gpushare.HAMiContainerLockDir)
	fs.StringVar(&o.paths.HAMiCacheRoot, "hami-core-cache-dir", defaultHAMiCacheDir, "host directory under which the plugin creates each hami-core container's own cache directory")
	fs.DurationVar(&o.probeEvery, "isolation-probe-interval", manager.DefaultProbeEvery, "how often the tier's prerequisite is checked (the MPS daemon answers, the HAMi-core files are there); a failure is published and refused at Allocate within about this long")
}

// check validates the flags: every path absolute and clean, as the plugin
// hands them to the container runtime.
func (o *isolationOptions) check() error {
	for name, p := range map[string]string{
		"--mps-pipe-dir": o.paths.MPSPipeDir, "--mps-log-dir": o.mpsLogDir, "--mps-shm-dir": o.paths.MPSShmDir,
		"--hami-core-library": o.paths.HAMiLibrary, "--hami-core-preload": o.paths.HAMiPreload,
		"--hami-core-lock-dir": o.paths.HAMiLockDir, "--hami-core-cache-dir": o.paths.HAMiCacheRoot,
	} {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("%s: %q is not a clean absolute path", name, p)
		}
	}
	if o.paths.MPSPipeDir == o.mpsLogDir {
		return fmt.Errorf("--mps-pipe-dir and --mps-log-dir must differ: containers mount the pipe directory, the logs are the node's")
	}
	if o.probeEvery <= 0 {
		return fmt.Errorf("--isolation-probe-interval must be positive")
	}
	return nil
}

// config builds the manager's tier configuration. The MPS daemon is built
// whatever the flag says, since a node label can select mps; it runs only
// while the node's tier is mps. It covers every GPU the plugin shares.
func (o *isolationOptions) config(lib nvml.Library, logger *zap.Logger) (manager.IsolationConfig, error) {
	gpus, err := lib.Devices()
	if err != nil {
		return manager.IsolationConfig{}, fmt.Errorf("read GPUs: %w", err)
	}
	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		uuids[i] = g.UUID
	}
	cfg := manager.IsolationConfig{Tier: o.tier, Paths: o.paths, ProbeEvery: o.probeEvery}
	if len(uuids) > 0 {
		cfg.MPS = mps.New(mps.Config{ControlBin: o.controlBin, PipeDir: o.paths.MPSPipeDir, LogDir: o.mpsLogDir,
			GPUs: uuids, Lib: lib, Logger: logger})
	}
	return cfg, nil
}
