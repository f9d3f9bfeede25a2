package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// KubeletCheckpoint is the kubelet's device-manager checkpoint in its
// device-plugin directory: every live container's Allocate answer.
const KubeletCheckpoint = "kubelet_internal_checkpoint"

// DefaultLimitsGrace is how long a limits device stays in the specification
// after it was last answered, whether or not the kubelet's checkpoint names
// it: the kubelet writes the checkpoint after Allocate returns.
const DefaultLimitsGrace = 10 * time.Minute

// LimitSpecsConfig configures a LimitSpecs.
type LimitSpecsConfig struct {
	// Dir is the CDI specification directory (gpushare.DefaultCDISpecDir in
	// production); it must be one of the runtime's cdi_spec_dirs.
	Dir string
	// Checkpoint is the kubelet's device-manager checkpoint
	// (<device-plugin dir>/KubeletCheckpoint); empty never prunes.
	Checkpoint string
	// Grace is DefaultLimitsGrace when 0.
	Grace  time.Duration
	Logger *zap.Logger
	// Now is time.Now when nil (tests move time).
	Now func() time.Time
}

// LimitSpecs keeps the plugin's CDI specification, gpushare.CDILimitsSpecFile
// in Dir: one device of kind gpushare.CDILimitsKind per set of tier
// variables answered (gpushare.CDILimitsDeviceName), whose container edits
// are those variables. A CDI runtime applies them after the container's own
// environment, so the container cannot lift its limit with env or envFrom.
//
//   - Writes are atomic (a temporary file in Dir, not named *.json or *.yaml
//     so no CDI reader takes it, renamed over the specification) and the
//     file is 0644, like the specifications nvidia-ctk writes: runtimes read
//     it as root; it holds limits, no secret.
//   - The specification holds, after each write, every device the kubelet's
//     checkpoint names (a container the kubelet restarts is created again
//     from its checkpointed answer, and must still resolve), every device
//     answered within Grace, and the device being written; others are pruned
//     then. When the checkpoint cannot be read nothing is pruned. A restarted
//     plugin starts from the file it finds, so running containers keep their
//     devices. Between writes the set is bounded by the node's signatures.
//   - A device name is a digest of its edits, so a name never changes
//     meaning; a device read back whose edits do not match its name is
//     dropped.
//   - Ensure fails when the specification cannot be written (the answer is
//     then refused: a container must never start without its limit), and
//     writes again when the file is no longer the one it wrote (removed, or
//     replaced by someone else).
type LimitSpecs struct {
	cfg  LimitSpecsConfig
	path string
	log  *zap.Logger

	mu      sync.Mutex
	devices map[string]*limitDevice // by device name
	written os.FileInfo             // the specification as last written; nil before
}

type limitDevice struct {
	env      []string
	answered time.Time
}

// NewLimitSpecs checks cfg and reads the specification already in Dir, if
// any; it writes nothing until the first Ensure.
func NewLimitSpecs(cfg LimitSpecsConfig) (*LimitSpecs, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) || filepath.Clean(cfg.Dir) != cfg.Dir {
		return nil, fmt.Errorf("CDI spec directory %q is not a clean absolute path", cfg.Dir)
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultLimitsGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	s := &LimitSpecs{cfg: cfg, path: filepath.Join(cfg.Dir, gpushare.CDILimitsSpecFile), log: log, devices: map[string]*limitDevice{}}
	data, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("read the CDI specification: %w", err)
	}
	var spec gpushare.CDISpec
	if err := json.Unmarshal(data, &spec); err != nil || spec.Kind != gpushare.CDILimitsKind {
		// Replaced at the first write; its devices resolved to nothing anyway.
		log.Warn("ignoring an unreadable CDI specification; it is replaced at the next write", zap.String("path", s.path),
			zap.String("kind", spec.Kind), zap.Error(err))
		return s, nil
	}
	now := cfg.Now()
	for _, d := range spec.Devices {
		if !gpushare.CDILimitsDeviceMatches(d.Name, d.ContainerEdits.Env) {
			log.Warn("dropping a CDI device whose edits do not match its name", zap.String("device", d.Name))
			continue
		}
		s.devices[d.Name] = &limitDevice{env: slices.Clone(d.ContainerEdits.Env), answered: now}
	}
	log.Info("read the CDI specification", zap.String("path", s.path), zap.Int("devices", len(s.devices)))
	return s, nil
}

// Path is the specification's path.
func (s *LimitSpecs) Path() string { return s.path }

// Ensure makes the specification hold device name with edits env, writing
// it when the device is new or the file is not the one last written, and
// returns only once the runtime can resolve it.
func (s *LimitSpecs) Ensure(name string, env []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	if d, ok := s.devices[name]; ok {
		if !slices.Equal(d.env, env) {
			return fmt.Errorf("CDI device %s already holds other edits", gpushare.CDILimitsDevice(name))
		}
		d.answered = now
		if s.unchanged() {
			return nil
		}
		s.log.Warn("the CDI specification is not the one written last; writing it again", zap.String("path", s.path))
		return s.write()
	}
	before := maps.Clone(s.devices)
	s.prune(now)
	s.devices[name] = &limitDevice{env: slices.Clone(env), answered: now}
	if err := s.write(); err != nil {
		s.devices = before
		return err
	}
	s.log.Info("CDI device added", zap.String("device", gpushare.CDILimitsDevice(name)), zap.Strings("env", env),
		zap.Int("devices", len(s.devices)), zap.Int("pruned", len(before)+1-len(s.devices)))
	return nil
}

// Devices lists the device names the specification holds, sorted.
func (s *LimitSpecs) Devices() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.devices))
}

// unchanged reports whether the file is still the one written last.
func (s *LimitSpecs) unchanged() bool {
	if s.written == nil {
		return false
	}
	cur, err := os.Stat(s.path)
	return err == nil && os.SameFile(cur, s.written) && cur.Size() == s.written.Size() && cur.ModTime().Equal(s.written.ModTime())
}

// prune drops the devices answered more than Grace ago that the kubelet's
// checkpoint does not name; with no checkpoint to read it drops nothing.
func (s *LimitSpecs) prune(now time.Time) {
	if s.cfg.Checkpoint == "" {
		return
	}
	var stale []string
	for name, d := range s.devices {
		if now.Sub(d.answered) >= s.cfg.Grace {
			stale = append(stale, name)
		}
	}
	if len(stale) == 0 {
		return
	}
	named, err := checkpointLimitsDevices(s.cfg.Checkpoint)
	if err != nil {
		s.log.Warn("cannot read the kubelet's checkpoint; no CDI device pruned", zap.Error(err))
		return
	}
	for _, name := range stale {
		if !named[name] {
			delete(s.devices, name)
		}
	}
}

// write replaces the specification with s.devices, atomically.
func (s *LimitSpecs) write() error {
	spec := gpushare.CDISpec{Version: gpushare.CDILimitsSpecVersion, Kind: gpushare.CDILimitsKind, Devices: []gpushare.CDIDevice{}}
	for _, name := range slices.Sorted(maps.Keys(s.devices)) {
		spec.Devices = append(spec.Devices, gpushare.CDIDevice{Name: name, ContainerEdits: gpushare.CDIContainerEdits{Env: s.devices[name].env}})
	}
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("write the CDI specification: %w", err)
	}
	if err := os.MkdirAll(s.cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("write the CDI specification: %w", err)
	}
	tmp, err := os.CreateTemp(s.cfg.Dir, "."+strings.TrimSuffix(gpushare.CDILimitsSpecFile, ".json")+"-*.tmp")
	if err != nil {
		return fmt.Errorf("write the CDI specification: %w", err)
	}
	fail := func(err error) error {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write the CDI specification %s: %w", s.path, err)
	}
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return fail(err)
	}
	if err := tmp.Sync(); err != nil {
		return fail(err)
	}
	if err := tmp.Close(); err != nil {
		return fail(err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write the CDI specification %s: %w", s.path, err)
	}
	s.written, err = os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("write the CDI specification %s: %w", s.path, err)
	}
	return nil
}

// checkpointLimitsDevices reads the kubelet's device-manager checkpoint and
// returns the names of the limits devices its answers name, in CDIDevices or
// in cdi.k8s.io/ annotations, whatever their resource.
func checkpointLimitsDevices(path string) (map[string]bool, error) {
	answers, err := ReadCheckpointAnswers(path)
	if err != nil {
		return nil, err
	}
	prefix := gpushare.CDILimitsKind + "="
	out := map[string]bool{}
	add := func(qualified string) {
		if name, ok := strings.CutPrefix(strings.TrimSpace(qualified), prefix); ok {
			out[name] = true
		}
	}
	for _, a := range answers {
		resp := a.Response
		for _, d := range resp.GetCdiDevices() {
			add(d.GetName())
		}
		for k, v := range resp.GetAnnotations() {
			if strings.HasPrefix(k, gpushare.CDIAnnotationPrefix) {
				for q := range strings.SplitSeq(v, ",") {
					add(q)
				}
			}
		}
	}
	return out, nil
}
