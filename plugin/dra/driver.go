package dra

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpushare/gpushare/plugin/dra/prepare"
	"github.com/gpushare/gpushare/plugin/dra/slice"
	"github.com/gpushare/gpushare/plugin/dra/store"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Driver implements kubeletplugin.DRAPlugin: it prepares claims on the
// node's GPUs by writing their CDI specifications and checkpoints what it
// answered, so a repeated call (the kubelet's or a restarted driver's)
// answers the same.
type Driver struct {
	log   *zap.Logger
	pool  string // this node's pool: its name
	node  *node
	store *store.Store
	cfg   prepare.Config
	// onError handles the helper's background errors (HandleError).
	onError func(ctx context.Context, err error, msg string)

	// kubeletConnected is set once the kubelet opened the health stream,
	// which it does only after accepting the driver's registration.
	kubeletConnected atomic.Bool

	// pods writes the device-plugin mode's record on translated pods; nil:
	// none is written.
	pods kubernetes.Interface

	mu sync.Mutex // serializes Prepare and Unprepare with the checkpoint
	// prepared is the checkpoint's content; nil until loaded.
	prepared map[types.UID]store.Claim
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// Registered tells whether the kubelet has accepted the driver's
// registration: it then opens the health stream (WatchHealthStatus). The
// helper's own RegistrationStatus is not safe to read concurrently.
func (d *Driver) Registered() bool { return d.kubeletConnected.Load() }

// newDriver loads the checkpoint of st.
func newDriver(log *zap.Logger, pool string, n *node, st *store.Store, cfg prepare.Config) (*Driver, error) {
	prepared, err := st.Load()
	if err != nil {
		return nil, err
	}
	d := &Driver{log: log, pool: pool, node: n, store: st, cfg: cfg, prepared: prepared}
	d.onError = func(_ context.Context, err error, msg string) { d.log.Error(msg, zap.Error(err)) }
	return d, nil
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin. A claim in the
// checkpoint gets its checkpointed answer again (its specification written
// anew if it went missing), whatever the GPUs' state now: its containers
// may already run with it. Any other claim is checked against the GPUs now
// and, if servable, written and checkpointed before it is answered.
//
// Then, outside the lock, it writes the device-plugin mode's record on the
// pods of claims the webhook made (writeRecords), when it has a client.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out, targets := d.prepareAll(claims)
	if d.pods != nil {
		writeRecords(ctx, d.log, d.pods, d.pool, targets)
	}
	return out, nil
}

// prepareAll prepares claims under the lock; targets are those prepared.
func (d *Driver) prepareAll(claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, []recordTarget) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var targets []recordTarget
	for _, c := range claims {
		if c == nil {
			continue
		}
		done, err := d.prepareOne(c)
		if err != nil {
			d.log.Warn("claim not prepared", zap.String("claim", c.Namespace+"/"+c.Name), zap.String("uid", string(c.UID)), zap.Error(err))
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		out[c.UID] = d.result(done)
		targets = append(targets, recordTarget{claim: c, done: done})
	}
	return out, targets
}

// prepareOne prepares one claim and returns it as checkpointed.
func (d *Driver) prepareOne(c *resourceapi.ResourceClaim) (store.Claim, error) {
	if done, ok := d.prepared[c.UID]; ok {
		return done, d.store.WriteSpec(c.UID, done.Spec)
	}
	shares, err := prepare.Shares(c, gpushare.DRADriverName, d.pool, d.cfg.Unit)
	if err != nil {
		return store.Claim{}, err
	}
	if err := prepare.Overcommit(d.sharesByClaim(), shares, d.capacity()); err != nil {
		return store.Claim{}, err
	}
	params, err := requestParams(c, shares)
	if err != nil {
		return store.Claim{}, err
	}
	claim := prepare.Claim{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Params: params}
	if d.node.tierStatus().Tier == gpushare.IsolationHAMiCore {
		claim.CacheDir = filepath.Join(d.cfg.Isolation.HAMiCacheRoot, "claim-"+string(c.UID))
	}
	ans, err := prepare.Build(claim, shares, d.node.prepareView(), d.cfg)
	if err != nil {
		return store.Claim{}, err
	}
	done := store.Claim{Namespace: c.Namespace, Name: c.Name, Shares: shares, Spec: ans.Spec, CacheDir: claim.CacheDir}
	done.SetCDIDevices(ans.Requests)
	if err := d.commit(c.UID, done, cacheDirs(ans.Requests)); err != nil {
		return store.Claim{}, err
	}
	for _, r := range ans.Requests {
		d.log.Info("claim prepared", zap.String("claim", c.Namespace+"/"+c.Name), zap.String("uid", string(c.UID)), zap.String("request", r.Request),
			zap.Strings("cdiDevices", r.CDIDevices), zap.Uint64("units", r.Env.ContainerUnits), zap.String("isolation", string(r.Env.Isolation)))
	}
	return done, nil
}

// requestParams reads each request's parameters: a configuration naming
// requests applies to those only.
func requestParams(c *resourceapi.ResourceClaim, shares []prepare.Share) (map[string]prepare.Params, error) {
	out := map[string]prepare.Params{}
	for _, s := range shares {
		r := prepare.BaseRequest(s.Request)
		if _, ok := out[r]; ok {
			continue
		}
		own := slices.DeleteFunc(slices.Clone(shares), func(o prepare.Share) bool { return prepare.BaseRequest(o.Request) != r })
		p, err := prepare.ClaimParams(c, gpushare.DRADriverName, own)
		if err != nil {
			return nil, err
		}
		out[r] = p
	}
	return out, nil
}

// cacheDirs are the HAMi-core cache directories of a claim's requests.
func cacheDirs(reqs []prepare.RequestAnswer) []string {
	var out []string
	for _, r := range reqs {
		if r.CacheDir != "" {
			out = append(out, r.CacheDir)
		}
	}
	return out
}

// commit creates the claim's cache directories, writes its specification
// and then the checkpoint: a crash in between leaves files the next
// Unprepare of that UID removes, never a checkpointed claim without its
// files.
func (d *Driver) commit(uid types.UID, done store.Claim, dirs []string) error {
	for _, dir := range dirs {
		// Every container user must be able to write HAMi-core's cache.
		if err := os.MkdirAll(dir, 0o777); err != nil {
			return fmt.Errorf("create the claim's HAMi-core cache directory: %w", err)
		}
		for p := dir; p != filepath.Dir(done.CacheDir) && p != "/" && p != "."; p = filepath.Dir(p) {
			if err := os.Chmod(p, 0o777); err != nil {
				return fmt.Errorf("create the claim's HAMi-core cache directory: %w", err)
			}
		}
	}
	if err := d.store.WriteSpec(uid, done.Spec); err != nil {
		return err
	}
	next := maps.Clone(d.prepared)
	next[uid] = done
	if err := d.store.Save(next); err != nil {
		return err
	}
	d.prepared = next
	return nil
}

// result is the kubelet's answer for a prepared claim: one device per
// share, each request's CDI devices on its first device only, so a
// container naming a request gets them once (the kubelet gives a container
// the devices of the request it names, or of the whole claim).
func (d *Driver) result(c store.Claim) kubeletplugin.PrepareResult {
	res := kubeletplugin.PrepareResult{Devices: make([]kubeletplugin.Device, 0, len(c.Shares))}
	given := map[string]bool{}
	for i, s := range c.Shares {
		base := prepare.BaseRequest(s.Request)
		dev := kubeletplugin.Device{Requests: []string{s.Request}, PoolName: s.Pool, DeviceName: s.Device, ShareID: s.ShareID}
		if base != s.Request {
			// A container names the request, not the subrequest chosen.
			dev.Requests = append(dev.Requests, base)
		}
		switch {
		case c.RequestCDIDevices == nil && i == 0:
			dev.CDIDeviceIDs = slices.Clone(c.CDIDevices)
		case c.RequestCDIDevices != nil && !given[base]:
			dev.CDIDeviceIDs = slices.Clone(c.RequestCDIDevices[base])
			given[base] = true
		}
		res.Devices = append(res.Devices, dev)
	}
	return res
}

// sharesByClaim is every prepared claim's shares.
func (d *Driver) sharesByClaim() map[types.UID][]prepare.Share {
	out := make(map[types.UID][]prepare.Share, len(d.prepared))
	for uid, c := range d.prepared {
		out[uid] = c.Shares
	}
	return out
}

// capacity is each GPU's capacity in units, by device name.
func (d *Driver) capacity() map[string]uint64 {
	out := map[string]uint64{}
	for _, g := range d.node.publish() {
		if name, err := slice.DeviceName(g.UUID); err == nil {
			out[name] = slice.CapacityUnits(g.MemoryMiB, d.cfg.Unit)
		}
	}
	return out
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin. It removes
// the claim's specification and cache directory by its UID, checkpointed
// or not, so a claim prepared by a driver that crashed before its
// checkpoint is cleaned up too; an unknown claim succeeds.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = d.unprepareOne(c.UID)
		if out[c.UID] == nil {
			d.log.Info("claim unprepared", zap.String("claim", c.Namespace+"/"+c.Name), zap.String("uid", string(c.UID)))
		}
	}
	return out, nil
}

// unprepareOne removes one claim's files, then its checkpoint entry.
func (d *Driver) unprepareOne(uid types.UID) error {
	if !validUID(uid) {
		return fmt.Errorf("claim UID %q cannot name a file", uid)
	}
	if err := d.store.RemoveSpec(uid); err != nil {
		return err
	}
	dir := d.prepared[uid].CacheDir
	if dir == "" && d.cfg.Isolation.HAMiCacheRoot != "" {
		dir = filepath.Join(d.cfg.Isolation.HAMiCacheRoot, "claim-"+string(uid))
	}
	if dir != "" {
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("remove the claim's HAMi-core cache directory: %w", err)
		}
	}
	if _, ok := d.prepared[uid]; !ok {
		return nil
	}
	next := maps.Clone(d.prepared)
	delete(next, uid)
	if err := d.store.Save(next); err != nil {
		return err
	}
	d.prepared = next
	return nil
}

// HandleError implements kubeletplugin.DRAPlugin. Every error the helper
// reports is logged; none stops the driver, since publishing retries and
// a gRPC server that failed is restarted by the kubelet's next connection.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.onError(ctx, err, msg)
}

// uidName is what a claim UID must look like before it names a file: no
// separator, nothing that leaves the directory.
var uidName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

func validUID(uid types.UID) bool { return uidName.MatchString(string(uid)) }
