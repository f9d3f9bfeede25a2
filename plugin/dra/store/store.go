// Package store keeps the DRA driver's files: the checkpoint of the claims
// it prepared (in its plugin data directory) and each claim's CDI
// specification (in the CDI directory). Every write is atomic (a temporary
// file, synced, renamed over the target, the directory synced), so a crash
// leaves the old file or the new one, never a torn one.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// CheckpointFile is the checkpoint's name in the plugin data directory.
const CheckpointFile = "checkpoint.json"

// checkpointVersion is the checkpoint's format; another is refused.
const checkpointVersion = 1

// Claim is a prepared claim as checkpointed: what Prepare answered, so a
// repeated Prepare (a kubelet restart, a plugin restart) answers the same
// and Unprepare knows what to remove.
type Claim struct {
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Shares    []prepare.Share `json:"shares"`
	// CDIDevices are the CDI device IDs of a claim of one request (the
	// checkpoint's first form, kept so either version reads the other's).
	CDIDevices []string `json:"cdiDevices"`
	// RequestCDIDevices are each request's CDI device IDs, for a claim of
	// several requests; nil otherwise.
	RequestCDIDevices map[string][]string `json:"requestCDIDevices,omitempty"`
	Spec              cdispec.Spec        `json:"spec"`
	CacheDir          string              `json:"cacheDir,omitempty"`
}

// SetCDIDevices records the requests' CDI device IDs: in CDIDevices for a
// claim of one request, in RequestCDIDevices otherwise.
func (c *Claim) SetCDIDevices(reqs []prepare.RequestAnswer) {
	c.CDIDevices, c.RequestCDIDevices = nil, nil
	if len(reqs) == 1 {
		c.CDIDevices = reqs[0].CDIDevices
		return
	}
	c.RequestCDIDevices = make(map[string][]string, len(reqs))
	for _, r := range reqs {
		c.RequestCDIDevices[r.Request] = r.CDIDevices
	}
}

// checkpoint is the file's shape.
type checkpoint struct {
	Version int                 `json:"version"`
	Claims  map[types.UID]Claim `json:"claims"`
}

// Store is the driver's two directories.
type Store struct {
	dataDir, cdiDir string
}

// New checks both directories are clean absolute paths and creates them.
func New(dataDir, cdiDir string) (*Store, error) {
	for _, d := range []string{dataDir, cdiDir} {
		if d == "" || !filepath.IsAbs(d) || filepath.Clean(d) != d {
			return nil, fmt.Errorf("store: %q is not a clean absolute path", d)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
	}
	return &Store{dataDir: dataDir, cdiDir: cdiDir}, nil
}

// CheckpointPath is the checkpoint file's path.
func (s *Store) CheckpointPath() string { return filepath.Join(s.dataDir, CheckpointFile) }

// SpecPath is the path of the CDI specification of the claim uid:
// <vendor>-<class>_<uid>.json, CDI's naming of generated specifications.
func (s *Store) SpecPath(uid types.UID) string {
	return filepath.Join(s.cdiDir, strings.ReplaceAll(gpushare.DRACDIKind, "/", "-")+"_"+string(uid)+".json")
}

// Load reads the checkpoint; none is no claim. An unreadable or foreign
// checkpoint is an error naming the file: guessing would risk answering a
// prepared claim differently.
func (s *Store) Load() (map[types.UID]Claim, error) {
	b, err := os.ReadFile(s.CheckpointPath())
	if errors.Is(err, fs.ErrNotExist) {
		return map[types.UID]Claim{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	var c checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("read checkpoint %s: %w; remove it to start afresh (the kubelet prepares its claims again)", s.CheckpointPath(), err)
	}
	if c.Version != checkpointVersion {
		return nil, fmt.Errorf("read checkpoint %s: version %d, want %d", s.CheckpointPath(), c.Version, checkpointVersion)
	}
	if c.Claims == nil {
		c.Claims = map[types.UID]Claim{}
	}
	return c.Claims, nil
}

// Save replaces the checkpoint with claims.
func (s *Store) Save(claims map[types.UID]Claim) error {
	b, err := json.Marshal(checkpoint{Version: checkpointVersion, Claims: claims})
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := writeAtomic(s.CheckpointPath(), b, 0o600); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return nil
}

// WriteSpec writes the claim uid's CDI specification, world-readable as
// nvidia-ctk writes its own: the runtime reads it, and it holds no secret.
func (s *Store) WriteSpec(uid types.UID, spec cdispec.Spec) error {
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("write CDI specification: %w", err)
	}
	if err := writeAtomic(s.SpecPath(uid), b, 0o644); err != nil {
		return fmt.Errorf("write CDI specification: %w", err)
	}
	return nil
}

// RemoveSpec removes the claim uid's CDI specification; none is fine.
func (s *Store) RemoveSpec(uid types.UID) error {
	if err := os.Remove(s.SpecPath(uid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove CDI specification: %w", err)
	}
	return nil
}

// writeAtomic replaces path with data. The temporary file's name does not
// end in .json, so no CDI reader takes it for a specification.
func writeAtomic(path string, data []byte, perm os.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
