package isolation

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// MPSDaemon is the node's one MPS control daemon, for every GPU of the tier
// (plugin/mps runs nvidia-cuda-mps-control; tests use fakes).
type MPSDaemon interface {
	// Start starts the daemon (and readies the GPUs for it); it returns once
	// the daemon answers, or with why it does not.
	Start(ctx context.Context) error
	// Healthy returns nil when the daemon answers a control command.
	Healthy(ctx context.Context) error
	// Stop stops the daemon and undoes what Start changed on the GPUs.
	Stop(ctx context.Context) error
	// PipeDir is the daemon's CUDA_MPS_PIPE_DIRECTORY.
	PipeDir() string
}

// Status is a GPU's tier as the plugin sees it now.
type Status struct {
	// Tier is the node's configured tier (-isolation, or the node label).
	// Empty where no tier is known: a caller that gives no Status (the
	// seed's answers, without GPUSHARE_ISOLATION), or an invalid node label
	// (then Down).
	Tier gpushare.Isolation
	// Down is true while Tier's prerequisite does not hold: the GPU offers
	// only none, and Allocate refuses its containers rather than start them
	// without the limit their node promises.
	Down bool
	// Reason says why the GPU is Down.
	Reason string
}

// Effective is the tier the GPU offers now, as published in gpushare.io/gpus.
func (s Status) Effective() gpushare.Isolation {
	if s.Down {
		return gpushare.IsolationNone
	}
	return s.Tier.OrNone()
}

// NodeTier returns the tier a node is configured for: its label
// gpushare.LabelIsolation when present, else flag. An invalid label is an
// error, not a fallback to flag: an operator who labelled a node to enforce
// limits and mistyped must not get containers without them.
func NodeTier(flag gpushare.Isolation, labels map[string]string) (gpushare.Isolation, error) {
	v, ok := labels[gpushare.LabelIsolation]
	if !ok {
		return flag, nil
	}
	t, err := gpushare.ParseIsolation(v)
	if err != nil || string(t) != v {
		return "", fmt.Errorf("node label %s=%q is not one of none, mps, hami-core", gpushare.LabelIsolation, v)
	}
	return t, nil
}

// Prober checks a tier's prerequisite.
type Prober struct {
	Config Config
	MPS    MPSDaemon // nil: no daemon, the mps tier is always down
}

// Probe returns the Status of tier on this node now: mps is up when the
// daemon answers, hami-core when its library, preload file, lock directory
// and cache root are in place, none always.
func (p Prober) Probe(ctx context.Context, tier gpushare.Isolation) Status {
	var err error
	switch tier {
	case gpushare.IsolationNone:
	case gpushare.IsolationMPS:
		err = p.mpsUp(ctx)
	case gpushare.IsolationHAMiCore:
		err = HAMiFilesReady(p.Config)
	default:
		err = fmt.Errorf("unknown isolation tier %q", tier)
	}
	if err != nil {
		return Status{Tier: tier, Down: true, Reason: err.Error()}
	}
	return Status{Tier: tier}
}

func (p Prober) mpsUp(ctx context.Context) error {
	if p.MPS == nil {
		return errors.New("no MPS control daemon is configured")
	}
	if err := p.MPS.Healthy(ctx); err != nil {
		return fmt.Errorf("the MPS control daemon does not answer: %w", err)
	}
	return nil
}

// HAMiFilesReady checks what a hami-core answer mounts: the library (a
// non-empty file), the preload file (naming the library's path in the
// container, without which the library is never loaded and nothing is
// limited), the lock directory and the cache root.
func HAMiFilesReady(cfg Config) error {
	if err := absolute("the HAMi-core paths", cfg.HAMiLibrary, cfg.HAMiPreload, cfg.HAMiLockDir, cfg.HAMiCacheRoot); err != nil {
		return err
	}
	if fi, err := os.Stat(cfg.HAMiLibrary); err != nil || !fi.Mode().IsRegular() || fi.Size() == 0 {
		return fmt.Errorf("the HAMi-core library %s is not a non-empty file (%v)", cfg.HAMiLibrary, err)
	}
	preload, err := os.ReadFile(cfg.HAMiPreload)
	if err != nil {
		return fmt.Errorf("the HAMi-core preload file: %w", err)
	}
	if !preloads(string(preload), gpushare.HAMiContainerLibrary) {
		return fmt.Errorf("the HAMi-core preload file %s does not name %s, where containers get the library", cfg.HAMiPreload, gpushare.HAMiContainerLibrary)
	}
	for _, dir := range []string{cfg.HAMiLockDir, cfg.HAMiCacheRoot} {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return fmt.Errorf("the HAMi-core directory %s is not a directory (%v)", dir, err)
		}
	}
	return nil
}

// preloads reports whether an ld.so.preload text lists lib: entries are
// separated by whitespace or colons (ld.so(8)).
func preloads(text, lib string) bool {
	for _, f := range strings.FieldsFunc(text, func(r rune) bool { return r == ':' || r == ' ' || r == '\t' || r == '\n' || r == '\r' }) {
		if f == lib {
			return true
		}
	}
	return false
}
