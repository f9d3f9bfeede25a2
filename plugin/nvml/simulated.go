package nvml

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxb200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/gpus"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"go.uber.org/zap"
)

// simulatedEventQueue is how many injected events may wait for a watcher;
// injections beyond it fail rather than block the injector.
const simulatedEventQueue = 64

// XidInjector is implemented only by simulated backends: tests and the
// end-to-end "inject an Xid" hook use it to make a GPU fail. Callers reach it
// with a type assertion on a Library, which fails for the real backend.
type XidInjector interface {
	// InjectXid raises a critical-Xid event on the GPU with NVML index index.
	InjectXid(index int, xid uint64) error
}

// machine is one simulated node a backend string can name.
type machine struct {
	name  string
	build func() (*server.Server, error)
	// topology is the default topology profile; nvlinks the NVLink links
	// of each GPU (to NVSwitches in the nvswitch profile).
	topology string
	nvlinks  int
}

// simulatedMachines lists the simulated nodes, built afresh on each call so
// the list cannot be changed by anyone.
func simulatedMachines() []machine {
	plain := func(f func() *server.Server) func() (*server.Server, error) {
		return func() (*server.Server, error) { return f(), nil }
	}
	return []machine{
		{name: "dgxa100", build: plain(dgxa100.New), topology: TopologyNVSwitch, nvlinks: 12}, // 8× A100-SXM4 40GB
		{name: "dgxh100", build: plain(dgxh100.New), topology: TopologyNVSwitch, nvlinks: 18}, // 8× H100 80GB
		{name: "dgxh200", build: plain(dgxh200.New), topology: TopologyNVSwitch, nvlinks: 18}, // 8× H200 141GB
		{name: "dgxb200", build: plain(dgxb200.New), topology: TopologyNVSwitch, nvlinks: 18}, // 8× B200 180GB
		{name: "mixed", build: newMixedMachine, topology: TopologyMixed, nvlinks: 12},
	}
}

// newMixedMachine builds a node with GPUs of different sizes (indices 0-1:
// H100 80GB, 2-3: A100 PCIe 40GB), so placement across unequal GPUs can be
// tested; no DGX mock has one.
func newMixedMachine() (*server.Server, error) {
	return server.New(
		server.WithGPUs(gpus.H100_SXM5_80GB, gpus.H100_SXM5_80GB, gpus.A100_PCIE_40GB, gpus.A100_PCIE_40GB),
		server.WithDriverVersion("550.54.15"),
		server.WithNVMLVersion("12.550.54.15"),
		server.WithCUDADriverVersion(12040),
	)
}

// Simulator is a Library over one of go-nvml's mock machines, plus event
// injection. Its GPU UUIDs are random per Simulator, as the mocks make them.
type Simulator struct {
	*library
	server *server.Server
	// queue carries injected events to whichever watcher waits next; with
	// several watchers each event reaches only one of them.
	queue chan nvml.EventData
	// usage holds the processes and utilisation tests set (ProcessSetter).
	usage *simUsage
}

var (
	_ Library     = (*Simulator)(nil)
	_ XidInjector = (*Simulator)(nil)
)

// NewSimulator builds the simulated backend named by backend: one of the
// "simulated:*" strings Backends lists, optionally followed by
// ":mig=<index>[,<index>...]" to put those GPUs in MIG mode (for example
// "simulated:dgxh100:mig=0,3") and by ":topology=<profile>" to connect the
// GPUs otherwise than the machine does by default (simTopologies).
func NewSimulator(logger *zap.Logger, backend string) (*Simulator, error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	spec, err := parseSimulated(backend)
	if err != nil {
		return nil, err
	}
	for _, m := range simulatedMachines() {
		if m.name != spec.machine {
			continue
		}
		srv, err := m.build()
		if err != nil {
			return nil, fmt.Errorf("build simulated machine %s: %w", spec.machine, err)
		}
		for _, i := range spec.mig {
			if i >= len(srv.Devices) {
				return nil, fmt.Errorf("%w %q: mig names GPU %d, the machine has %d", ErrUnknownBackend, backend, i, len(srv.Devices))
			}
		}
		profile := spec.topology
		if profile == "" {
			profile = m.topology
		}
		return newSimulatorFromServer(logger, backend, srv, spec.mig, newSimTopology(profile, len(srv.Devices), m.nvlinks))
	}
	return nil, unknownBackend(backend)
}

// simulatedSpec is a parsed simulated backend string.
type simulatedSpec struct {
	machine string
	mig     []int // GPU indices in MIG mode, ascending
	// topology is the profile (simTopologies); "" for the machine's default.
	topology string
}

// parseSimulated reads "simulated:<machine>[:mig=<i>[,<j>...]][:topology=<profile>]",
// the options in either order, each at most once. It checks the syntax
// only; the machine and the indices are checked against the machine by
// NewSimulator.
func parseSimulated(backend string) (simulatedSpec, error) {
	rest, ok := strings.CutPrefix(backend, simulatedPrefix)
	if !ok {
		return simulatedSpec{}, unknownBackend(backend)
	}
	machine, opts, hasOpts := strings.Cut(rest, ":")
	spec := simulatedSpec{machine: machine}
	if !hasOpts {
		return spec, nil
	}
	var sawMIG bool
	for _, opt := range strings.Split(opts, ":") {
		if profile, ok := strings.CutPrefix(opt, "topology="); ok && spec.topology == "" {
			if !slices.Contains(simTopologies(), profile) {
				return simulatedSpec{}, fmt.Errorf("%w %q: topology wants one of %s, not %q", ErrUnknownBackend, backend,
					strings.Join(simTopologies(), ", "), profile)
			}
			spec.topology = profile
			continue
		}
		list, ok := strings.CutPrefix(opt, "mig=")
		if !ok || sawMIG {
			return simulatedSpec{}, fmt.Errorf("%w %q: after the machine only \":mig=<index>[,<index>...]\" and "+
				"\":topology=<profile>\" are allowed, each once", ErrUnknownBackend, backend)
		}
		sawMIG = true
		seen := map[int]bool{}
		for _, item := range strings.Split(list, ",") {
			i, err := strconv.Atoi(item)
			if err != nil || i < 0 || strconv.Itoa(i) != item || seen[i] {
				return simulatedSpec{}, fmt.Errorf("%w %q: mig wants distinct GPU indices, not %q", ErrUnknownBackend, backend, item)
			}
			seen[i] = true
			spec.mig = append(spec.mig, i)
		}
	}
	slices.Sort(spec.mig)
	return spec, nil
}

// newSimulatorFromServer completes a mock machine with what the go-nvml mocks
// leave out (events, PCI bus IDs) and initialises it as the real library is.
// GPUs at the indices in mig are put in MIG mode.
func newSimulatorFromServer(logger *zap.Logger, backend string, srv *server.Server, mig []int, topo simTopology) (*Simulator, error) {
	s := &Simulator{server: srv, queue: make(chan nvml.EventData, simulatedEventQueue),
		usage: &simUsage{procs: map[int][]Process{}, util: map[int]int{}}}
	srv.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return newSimEventSet(s.queue), nvml.SUCCESS
	}
	for i, d := range srv.Devices {
		dev, ok := d.(*server.Device)
		if !ok {
			return nil, fmt.Errorf("build simulated machine: unexpected device type %T", d)
		}
		completeSimDevice(dev)
		s.usage.completeUsage(i, dev)
		topo.apply(i, dev, srv.Devices)
		if slices.Contains(mig, i) {
			dev.MigMode = nvml.DEVICE_MIG_ENABLE
		}
	}
	l, err := openLibrary(logger, backend, srv, true)
	if err != nil {
		return nil, fmt.Errorf("simulated machine %s: %w", backend, err)
	}
	l.numa = topo.numaOf(srv.Devices)
	s.library = l
	return s, nil
}

// completeSimDevice adds event support, a compute mode and a PCI bus ID to a
// mock GPU: the mocks panic on event and compute-mode calls and report an
// empty bus ID.
func completeSimDevice(dev *server.Device) {
	dev.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		return nvml.EventTypeXidCriticalError | nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError, nvml.SUCCESS
	}
	dev.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		s, ok := set.(*simEventSet)
		if !ok {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		s.register(dev, mask)
		return nvml.SUCCESS
	}
	completeSimComputeMode(dev)
	pciInfo := dev.GetPciInfoFunc
	busID := dev.PciBusID
	dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
		p, ret := pciInfo()
		if ret != nvml.SUCCESS {
			return p, ret
		}
		for i := range p.BusId {
			p.BusId[i] = 0
		}
		for i := 0; i < len(busID) && i < len(p.BusId)-1; i++ {
			p.BusId[i] = int8(busID[i])
		}
		return p, nvml.SUCCESS
	}
}

// completeSimComputeMode gives a mock GPU a compute mode that starts at
// DEFAULT, as on a freshly booted machine, and remembers what is set, so tests
// read back what the code under test changed. Invalid modes fail as NVML does.
func completeSimComputeMode(dev *server.Device) {
	mode := nvml.COMPUTEMODE_DEFAULT // guarded by dev's lock
	dev.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
		dev.RLock()
		defer dev.RUnlock()
		return mode, nvml.SUCCESS
	}
	dev.SetComputeModeFunc = func(m nvml.ComputeMode) nvml.Return {
		if m < nvml.COMPUTEMODE_DEFAULT || m >= nvml.COMPUTEMODE_COUNT {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		dev.Lock()
		defer dev.Unlock()
		mode = m
		return nvml.SUCCESS
	}
}

// InjectXid implements XidInjector. The event waits in a queue until a
// health watcher takes it, so an Xid injected before WatchHealth has
// registered the GPUs is not lost.
func (s *Simulator) InjectXid(index int, xid uint64) error {
	if err := s.inject(index, nvml.EventTypeXidCriticalError, xid); err != nil {
		return fmt.Errorf("inject Xid %d on simulated GPU %d: %w", xid, index, err)
	}
	s.log.Info("injected simulated Xid", zap.Int("index", index), zap.Uint64("xid", xid))
	return nil
}

// inject queues one NVML event for the GPU at index.
func (s *Simulator) inject(index int, eventType, data uint64) error {
	if err := s.enter(); err != nil {
		return err
	}
	defer s.calls.Done()
	if index < 0 || index >= len(s.server.Devices) {
		return fmt.Errorf("no GPU with index %d (the machine has %d)", index, len(s.server.Devices))
	}
	ev := nvml.EventData{
		Device:            s.server.Devices[index],
		EventType:         eventType,
		EventData:         data,
		GpuInstanceId:     ^uint32(0),
		ComputeInstanceId: ^uint32(0),
	}
	select {
	case s.queue <- ev:
		return nil
	default:
		return fmt.Errorf("event queue full (%d events wait for a health watcher)", cap(s.queue))
	}
}

// simEventSet is a go-nvml mock EventSet whose Wait reads injected events.
type simEventSet struct {
	mock.EventSet
	queue <-chan nvml.EventData

	mu sync.Mutex
	// masks holds the event types each GPU registered, as NVML filters by them.
	masks map[nvml.Device]uint64
}

// newSimEventSet makes an event set fed by queue.
func newSimEventSet(queue <-chan nvml.EventData) *simEventSet {
	s := &simEventSet{queue: queue, masks: make(map[nvml.Device]uint64)}
	s.WaitFunc = s.wait
	s.FreeFunc = func() nvml.Return { return nvml.SUCCESS }
	return s
}

// register records that dev wants the event types in mask.
func (s *simEventSet) register(dev nvml.Device, mask uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.masks[dev] |= mask
}

// wants reports whether ev matches a registration, as NVML delivers only those.
func (s *simEventSet) wants(ev nvml.EventData) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.masks[ev.Device]&ev.EventType != 0
}

// wait behaves as nvmlEventSetWait: an event, or ERROR_TIMEOUT after timeoutMs.
// Events for unregistered GPUs or types are consumed and dropped, as NVML
// would never have raised them on this set.
func (s *simEventSet) wait(timeoutMs uint32) (nvml.EventData, nvml.Return) {
	t := time.NewTimer(time.Duration(timeoutMs) * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case ev := <-s.queue:
			if s.wants(ev) {
				return ev, nvml.SUCCESS
			}
		case <-t.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
}
