package prepare

import (
	"fmt"
	"maps"
	"path/filepath"
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
	// (hami-core only; the driver creates it). With several requests each
	// request's containers get a directory of their own below it.
	CacheDir string
	// Params are each request's own settings (ClaimParams of its shares),
	// by request name; a request not in it has none.
	Params map[string]Params
}

// Answer is what Prepare hands the kubelet for a claim.
type Answer struct {
	// Spec is the claim's CDI specification: one device per request, named
	// by the claim's UID when it has one request (as before requests could
	// be several), by <UID>-<request> otherwise.
	Spec cdispec.Spec
	// Requests are each request's part of the answer, in the order of the
	// claim's results.
	Requests []RequestAnswer
}

// RequestAnswer is what the containers naming one request of the claim get.
type RequestAnswer struct {
	Request string
	// CDIDevices are the CDI device IDs of the request's containers: its
	// GPUs' NVIDIA devices (Config.CDIGPUs), then its own.
	CDIDevices []string
	// Env is the contract's view of the request (the gpushare variables).
	Env gpushare.ContainerEnv
	// CacheDir is its HAMi-core cache directory ("" unless hami-core).
	CacheDir string
}

// cdiName is what a CDI device name may hold (CDI's parser: letters,
// digits, '_', '.', ':' and '-'); a claim UID and a request name always do.
var cdiName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`)

// Build checks that shares can be served on gpus and returns the claim's
// answer. Each request of the claim is a container's (the webhook gives
// each container a request; a container naming the whole claim gets every
// request's device, and the variables of the last, never more than the
// claim holds). A request's containers get its GPUs, the gpushare variables
// of a container holding the request's units (_POD: the claim's), and the
// tier's enforcement of exactly those units: isolation.For computes the
// same variables and mounts as for a device-plugin container of that size.
// It refuses a claim with no share, a request holding a GPU twice or GPUs
// of different sizes, an unknown, unhealthy or too small GPU, GPUs of
// different tiers, and a tier that is down.
func Build(c Claim, shares []Share, gpus []GPU, cfg Config) (Answer, error) {
	if !cdiName.MatchString(string(c.UID)) {
		return Answer{}, fmt.Errorf("%w: UID %q cannot name a CDI device", ErrInvalidClaim, c.UID)
	}
	groups, err := servable(c, shares, gpus)
	if err != nil {
		return Answer{}, err
	}
	var podUnits uint64
	for _, g := range groups {
		podUnits += g.units()
	}
	a := Answer{Spec: cdispec.Spec{Version: gpushare.DRACDISpecVersion, Kind: gpushare.DRACDIKind}}
	for _, g := range groups {
		name, cacheDir := string(c.UID), c.CacheDir
		if len(groups) > 1 {
			name += "-" + g.request
			if cacheDir != "" {
				cacheDir = filepath.Join(cacheDir, g.request)
			}
		}
		if !cdiName.MatchString(name) {
			return Answer{}, fmt.Errorf("%w: request %q cannot name a CDI device", ErrInvalidClaim, g.request)
		}
		env := requestEnv(g.gpus, podUnits)
		env.ComputePercent = c.Params[g.request].ComputePercent
		edits, err := containerEdits(env, g.gpus, cacheDir, cfg)
		if err != nil {
			return Answer{}, err
		}
		a.Spec.Devices = append(a.Spec.Devices, cdispec.Device{Name: name, ContainerEdits: edits})
		ra := RequestAnswer{Request: g.request, Env: env, CacheDir: cacheDir}
		if cfg.CDIGPUs {
			for _, gpu := range g.gpus {
				ra.CDIDevices = append(ra.CDIDevices, gpushare.CDIKind+"="+gpuID(gpu, cfg.IDs))
			}
		}
		ra.CDIDevices = append(ra.CDIDevices, gpushare.DRACDIKind+"="+name)
		a.Requests = append(a.Requests, ra)
	}
	return a, nil
}

// containerEdits are a request's CDI edits: the gpushare variables and the
// tier's variables and mounts for env's units on gpus.
func containerEdits(env gpushare.ContainerEnv, gpus []claimGPU, cacheDir string, cfg Config) (cdispec.ContainerEdits, error) {
	uuids := make([]string, len(gpus))
	for i, g := range gpus {
		uuids[i] = g.UUID
	}
	tier, err := isolation.For(cfg.Isolation, isolation.Request{Env: env, UUIDs: uuids, Unit: cfg.Unit, CacheDir: cacheDir})
	if err != nil {
		return cdispec.ContainerEdits{}, fmt.Errorf("%w: isolation tier %s: %w", ErrInvalidClaim, env.Isolation, err)
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
	return edits, nil
}

// claimGPU is a GPU of the claim with the units a request holds on it.
type claimGPU struct {
	GPU
	held uint64
}

// requestGPUs is one request's GPUs, ascending by index.
type requestGPUs struct {
	request string
	gpus    []claimGPU
}

// units is what the request holds over all its GPUs.
func (r requestGPUs) units() uint64 { return r.gpus[0].held * uint64(len(r.gpus)) }

// servable checks shares against gpus and returns them by request, in the
// order of the claim's results.
func servable(c Claim, shares []Share, gpus []GPU) ([]requestGPUs, error) {
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
	var groups []requestGPUs
	for _, ss := range byRequest(shares) {
		set, err := requestSet(ss, byName)
		if err != nil {
			return nil, refuse("request %q: %v", BaseRequest(ss[0].Request), err)
		}
		groups = append(groups, requestGPUs{request: BaseRequest(ss[0].Request), gpus: set})
	}
	first := groups[0].gpus[0]
	for _, r := range groups {
		for _, g := range r.gpus {
			if g.Tier.Tier.OrNone() != first.Tier.Tier.OrNone() {
				return nil, refuse("its GPUs are configured for different isolation tiers (GPU %d %q, GPU %d %q)",
					first.Index, first.Tier.Tier.OrNone(), g.Index, g.Tier.Tier.OrNone())
			}
		}
	}
	return groups, nil
}

// byRequest groups shares by their base request, in order of appearance.
func byRequest(shares []Share) [][]Share {
	var out [][]Share
	at := map[string]int{}
	for _, s := range shares {
		r := BaseRequest(s.Request)
		i, ok := at[r]
		if !ok {
			i = len(out)
			at[r] = i
			out = append(out, nil)
		}
		out[i] = append(out[i], s)
	}
	return out
}

// requestSet checks one request's shares and returns its GPUs by index.
func requestSet(shares []Share, byName map[string]GPU) ([]claimGPU, error) {
	set := make([]claimGPU, 0, len(shares))
	seen := map[int]bool{}
	for _, s := range shares {
		g, ok := byName[s.Device]
		switch {
		case !ok:
			return nil, fmt.Errorf("device %s is not one of this node's GPUs (gone since it was allocated?)", s.Device)
		case seen[g.Index]:
			return nil, fmt.Errorf("it holds GPU %d (%s) twice; add distinctAttribute %q to the request's constraints", g.Index, s.Device, gpushare.DRADriverName+"/"+gpushare.DRAAttributeUUID)
		case s.Units != shares[0].Units:
			return nil, fmt.Errorf("it holds %d units of GPU %d and %d of another; gpushare limits every GPU of a container alike", s.Units, g.Index, shares[0].Units)
		case s.Units > g.Units:
			return nil, fmt.Errorf("it holds %d units of GPU %d, which has %d", s.Units, g.Index, g.Units)
		case g.Fault != "":
			return nil, fmt.Errorf("GPU %d (%s) is unhealthy: %s", g.Index, g.UUID, g.Fault)
		case g.Tier.Down:
			return nil, fmt.Errorf("isolation tier unavailable: GPU %d is configured for isolation tier %q, which is down: %s; refusing it rather than start it without its memory limit",
				g.Index, g.Tier.Tier, g.Tier.Reason)
		}
		seen[g.Index] = true
		set = append(set, claimGPU{GPU: g, held: s.Units})
	}
	slices.SortFunc(set, func(a, b claimGPU) int { return a.Index - b.Index })
	return set, nil
}

// requestEnv is the contract's environment of a container holding one
// request: ALIYUN_COM_GPU_MEM_CONTAINER is the request's units over its
// GPUs, _POD the claim's (the claim is the unit of sharing; a pod's other
// claims are not the driver's to know), _DEV the first GPU's size, _IDX
// the request's GPUs.
func requestEnv(set []claimGPU, claimUnits uint64) gpushare.ContainerEnv {
	e := gpushare.ContainerEnv{GPUIndex: set[0].Index, PodUnits: claimUnits, ContainerUnits: set[0].held * uint64(len(set)),
		DevUnits: set[0].Units, Isolation: set[0].Tier.Tier.OrNone()}
	if len(set) > 1 {
		idx := make([]int, len(set))
		for i, g := range set {
			idx[i] = g.Index
		}
		e.GPUs = gpushare.NewGPUSet(idx...)
	}
	return e
}

// BaseRequest is a result's request without its subrequest.
func BaseRequest(r string) string {
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
