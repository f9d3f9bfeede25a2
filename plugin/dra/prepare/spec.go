package prepare

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

// GPU is one of the node's published GPUs as Prepare needs it.
type GPU struct {
	Index int
	UUID  string
	Units uint64 // its capacity in units
	// Tier is its isolation tier's state now.
	Tier isolation.Status
	// Fault says why it is unhealthy (its device is tainted); "" when healthy.
	Fault string
}

// Config is the node's side of every claim's answer.
type Config struct {
	Unit      gpushare.Unit
	Isolation isolation.Config // the tiers' host paths
	// CDIGPUs names each GPU to the runtime as NVIDIA's CDI device
	// (gpushare.CDIKind=<id>) before the claim's own, with
	// NVIDIA_VISIBLE_DEVICES=void in the claim's edits; false names them in
	// NVIDIA_VISIBLE_DEVICES by index, for the NVIDIA runtime's hook.
	CDIGPUs bool
	// IDs is how a GPU is named in its CDI device: uuid (default) or index.
	IDs gpushare.DeviceIDStrategy
}

// Claim is a claim being prepared.
type Claim struct {
	UID       types.UID
	Namespace string
	Name      string
	// CacheDir is the claim's own HAMi-core cache directory on the host
	// (hami-core only; the driver creates it).
	CacheDir string
	// Params are the claim's own settings (ClaimParams).
	Params Params
}

// Answer is what Prepare hands the kubelet for a claim.
type Answer struct {
	// Spec is the claim's CDI specification, one device named by its UID.
	Spec cdispec.Spec
	// CDIDevices are the CDI device IDs every container of the claim gets:
	// the GPUs' NVIDIA devices (Config.CDIGPUs), then the claim's.
	CDIDevices []string
	// Env is the contract's view of the claim (the gpushare variables).
	Env gpushare.ContainerEnv
}

// cdiName is what a CDI device name may hold (CDI's parser: letters,
// digits, '_', '.', ':' and '-'); a claim UID always does.
var cdiName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// Build checks that shares can be served on gpus and returns the claim's
// answer. A container gets every GPU of the claim, the gpushare variables
// of a container holding the claim's units (units per GPU equal, as the
// contract splits evenly), and the tier's enforcement of exactly those
// units: isolation.For computes the same variables and mounts as for a
// device-plugin container of that size. It refuses a claim with no share,
// shares of several requests (one set of variables cannot tell a
// container which request is its own), a GPU twice or of another size than
// the rest, an unknown, unhealthy or too small GPU, GPUs of different tiers,
// and a tier that is down.
func Build(c Claim, shares []Share, gpus []GPU, cfg Config) (Answer, error) {
	if !cdiName.MatchString(string(c.UID)) {
		return Answer{}, fmt.Errorf("%w: UID %q cannot name a CDI device", ErrInvalidClaim, c.UID)
	}
	set, err := servable(c, shares, gpus)
	if err != nil {
		return Answer{}, err
	}
	env := claimEnv(set)
	env.ComputePercent = c.Params.ComputePercent
	uuids := make([]string, len(set))
	for i, g := range set {
		uuids[i] = g.UUID
	}
	tier, err := isolation.For(cfg.Isolation, isolation.Request{Env: env, UUIDs: uuids, Unit: cfg.Unit, CacheDir: c.CacheDir})
	if err != nil {
		return Answer{}, fmt.Errorf("%w: isolation tier %s: %w", ErrInvalidClaim, env.Isolation, err)
	}
	vars := env.Map()
	maps.Copy(vars, tier.Envs)
	if cfg.CDIGPUs {
		vars[gpushare.EnvVisibleDevices] = gpushare.VisibleDevicesVoid
	}
	edits := cdispec.ContainerEdits{Env: gpushare.CDILimitsEnv(vars)}
	for _, m := range tier.Mounts {
		edits.Mounts = append(edits.Mounts, bindMount(m.HostPath, m.ContainerPath, m.ReadOnly))
	}
	a := Answer{
		Spec: cdispec.Spec{Version: gpushare.DRACDISpecVersion, Kind: gpushare.DRACDIKind,
			Devices: []cdispec.Device{{Name: string(c.UID), ContainerEdits: edits}}},
		Env: env,
	}
	if cfg.CDIGPUs {
		for _, g := range set {
			a.CDIDevices = append(a.CDIDevices, gpushare.CDIKind+"="+gpuID(g, cfg.IDs))
		}
	}
	a.CDIDevices = append(a.CDIDevices, gpushare.DRACDIKind+"="+string(c.UID))
	return a, nil
}

// claimGPU is a GPU of the claim with the units the claim holds on it.
type claimGPU struct {
	GPU
	held uint64
}

// servable checks shares against gpus and returns the claim's GPUs,
// ascending by index.
func servable(c Claim, shares []Share, gpus []GPU) ([]claimGPU, error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w %s/%s: %s", ErrInvalidClaim, c.Namespace, c.Name, fmt.Sprintf(format, args...))
	}
	if len(shares) == 0 {
		return nil, refuse("no device of %s on this node is allocated to it", gpushare.DRADriverName)
	}
	byName, err := deviceNames(gpus)
	if err != nil {
		return nil, refuse("%v", err)
	}
	set := make([]claimGPU, 0, len(shares))
	seen := map[int]bool{}
	for _, s := range shares {
		g, ok := byName[s.Device]
		switch {
		case baseRequest(s.Request) != baseRequest(shares[0].Request):
			return nil, refuse("it has results of requests %q and %q; a claim of %s gives its containers one set of GPUs, so ask for them in one request (count: N)",
				baseRequest(shares[0].Request), baseRequest(s.Request), gpushare.DRADriverName)
		case !ok:
			return nil, refuse("device %s is not one of this node's GPUs (gone since it was allocated?)", s.Device)
		case seen[g.Index]:
			return nil, refuse("it holds GPU %d (%s) twice; add distinctAttribute %q to the request's constraints", g.Index, s.Device, gpushare.DRADriverName+"/"+gpushare.DRAAttributeUUID)
		case s.Units != shares[0].Units:
			return nil, refuse("it holds %d units of GPU %d and %d of another; gpushare limits every GPU of a container alike", s.Units, g.Index, shares[0].Units)
		case s.Units > g.Units:
			return nil, refuse("it holds %d units of GPU %d, which has %d", s.Units, g.Index, g.Units)
		case g.Fault != "":
			return nil, refuse("GPU %d (%s) is unhealthy: %s", g.Index, g.UUID, g.Fault)
		case g.Tier.Down:
			return nil, refuse("isolation tier unavailable: GPU %d is configured for isolation tier %q, which is down: %s; refusing it rather than start it without its memory limit",
				g.Index, g.Tier.Tier, g.Tier.Reason)
		}
		seen[g.Index] = true
		set = append(set, claimGPU{GPU: g, held: s.Units})
	}
	slices.SortFunc(set, func(a, b claimGPU) int { return a.Index - b.Index })
	for _, g := range set[1:] {
		if g.Tier.Tier.OrNone() != set[0].Tier.Tier.OrNone() {
			return nil, refuse("its GPUs are configured for different isolation tiers (GPU %d %q, GPU %d %q)",
				set[0].Index, set[0].Tier.Tier.OrNone(), g.Index, g.Tier.Tier.OrNone())
		}
	}
	return set, nil
}

// claimEnv is the contract's environment of a container holding the whole
// claim: ALIYUN_COM_GPU_MEM_CONTAINER and _POD are the claim's units over
// all its GPUs (the claim is the unit of sharing; a pod's other claims are
// not the driver's to know), _DEV the first GPU's size, _IDX the GPUs.
func claimEnv(set []claimGPU) gpushare.ContainerEnv {
	total := set[0].held * uint64(len(set))
	e := gpushare.ContainerEnv{GPUIndex: set[0].Index, PodUnits: total, ContainerUnits: total, DevUnits: set[0].Units,
		Isolation: set[0].Tier.Tier.OrNone()}
	if len(set) > 1 {
		idx := make([]int, len(set))
		for i, g := range set {
			idx[i] = g.Index
		}
		e.GPUs = gpushare.NewGPUSet(idx...)
	}
	return e
}

// baseRequest is a result's request without its subrequest.
func baseRequest(r string) string {
	for i := range len(r) {
		if r[i] == '/' {
			return r[:i]
		}
	}
	return r
}

// gpuID names g in NVIDIA's CDI specification.
func gpuID(g claimGPU, ids gpushare.DeviceIDStrategy) string {
	if ids == gpushare.DeviceIDIndex {
		return strconv.Itoa(g.Index)
	}
	return g.UUID
}

// bindMount is a CDI bind mount, with the options NVIDIA's CDI
// specifications use for the driver's files.
func bindMount(host, container string, readOnly bool) *cdispec.Mount {
	opts := []string{"nosuid", "nodev", "bind"}
	if readOnly {
		opts = append([]string{"ro"}, opts...)
	}
	return &cdispec.Mount{HostPath: host, ContainerPath: container, Options: opts, Type: "bind"}
}
