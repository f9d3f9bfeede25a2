package manager

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"time"

	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/server"
)

// The hami-core cache directories newCacheDir creates are removed once no
// live container mounts them: the kubelet's device-manager checkpoint holds
// every live container's Allocate answer, mounts included. An answer given a
// moment ago may not be in it yet (the kubelet writes it after Allocate
// returns), so a directory is left alone until it is cacheGrace old.
const (
	cacheSweepEvery = time.Minute
	cacheGrace      = 10 * time.Minute
	// checkpointFile is the kubelet's device-manager checkpoint in its
	// device-plugin directory.
	checkpointFile = "kubelet_internal_checkpoint"
)

// cacheDirName is the name newCacheDir's os.MkdirTemp(root, "c-") gives: the
// prefix and a random uint32 in decimal.
var cacheDirName = regexp.MustCompile(`^c-[0-9]{1,10}$`)

// cacheEntry is one entry of the cache root as listed (not followed).
type cacheEntry struct {
	Name    string
	Dir     bool // a directory itself, not a symlink to one
	ModTime time.Time
}

// staleCacheDirs returns the names of entries to remove: directories named as
// newCacheDir names them, whose path under root no live container mounts
// (mounted holds host paths, cleaned), and last modified at least grace
// before now.
func staleCacheDirs(root string, entries []cacheEntry, mounted map[string]bool, now time.Time, grace time.Duration) []string {
	var stale []string
	for _, e := range entries {
		if !e.Dir || !cacheDirName.MatchString(e.Name) || mounted[filepath.Join(root, e.Name)] || now.Sub(e.ModTime) < grace {
			continue
		}
		stale = append(stale, e.Name)
	}
	return stale
}

// mountedHostPaths reads the kubelet's checkpoint at path and returns the
// host paths (cleaned) of every mount of every container's answer, whatever
// its resource.
func mountedHostPaths(path string) (map[string]bool, error) {
	answers, err := server.ReadCheckpointAnswers(path)
	if err != nil {
		return nil, err
	}
	mounted := map[string]bool{}
	for _, a := range answers {
		for _, m := range a.Response.GetMounts() {
			mounted[filepath.Clean(m.HostPath)] = true
		}
	}
	return mounted, nil
}

// sweepCacheDirs removes root's stale cache directories (staleCacheDirs) and
// returns how many it removed. A root that does not exist (the node never had
// the hami-core tier) is no error and nothing to do. Nothing is removed when
// the checkpoint cannot be read.
func sweepCacheDirs(root, checkpoint string, now time.Time, grace time.Duration) (int, error) {
	if root == "" {
		return 0, nil
	}
	// Listed before the checkpoint is read: a directory old enough to be
	// removed was answered before the read, so the read has its answer.
	des, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	entries := make([]cacheEntry, 0, len(des))
	for _, de := range des {
		info, err := de.Info() // lstat: a symlink stays a symlink
		if err != nil {
			continue // gone meanwhile
		}
		entries = append(entries, cacheEntry{Name: de.Name(), Dir: info.Mode().IsDir(), ModTime: info.ModTime()})
	}
	mounted, err := mountedHostPaths(checkpoint)
	if err != nil {
		return 0, fmt.Errorf("read the kubelet's checkpoint: %w", err)
	}
	// Host paths as the plugin wrote them: joined onto the configured root.
	root = filepath.Clean(root)
	removed := 0
	var errs []error
	for _, name := range staleCacheDirs(root, entries, mounted, now, grace) {
		// RemoveAll removes a symlink inside, never what it points to.
		if err := os.RemoveAll(filepath.Join(root, name)); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// sweepCaches is one tick of the cache sweep.
func (m *Manager) sweepCaches() {
	root := m.cfg.Isolation.Paths.HAMiCacheRoot
	checkpoint := filepath.Join(m.cfg.DevicePluginDir, checkpointFile)
	removed, err := sweepCacheDirs(root, checkpoint, time.Now(), cacheGrace)
	if err != nil {
		m.log.Warn("cannot clean up the hami-core cache directories", zap.String("root", root), zap.Error(err))
	}
	if removed > 0 {
		m.log.Info("removed hami-core cache directories no container mounts", zap.String("root", root), zap.Int("removed", removed))
	}
}
