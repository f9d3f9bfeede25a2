package nvml

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/gpushare/gpushare/plugin/topology"
)

// BackendNVML selects the real NVIDIA library (libnvidia-ml.so.1).
const BackendNVML = "nvml"

// simulatedPrefix starts every simulated backend string, so logs and the
// node's published GPU description show at a glance that no GPU is real.
const simulatedPrefix = "simulated:"

// GPU is one physical GPU as the device plugin needs it.
type GPU struct {
	// Index is the NVML index, the form NVIDIA_VISIBLE_DEVICES accepts.
	Index int
	// UUID is NVML's stable identity ("GPU-..."); indices can change across reboots.
	UUID string
	// Model is NVML's product name, e.g. "NVIDIA H100 80GB HBM3".
	Model string
	// MemoryMiB is total memory in MiB, exactly bytes / 1<<20 (rounded down).
	MemoryMiB uint64
	// Minor is the device node number: /dev/nvidia<Minor> is what a container gets.
	Minor int
	// PCIBusID is the bus ID in sysfs form ("0000:3b:00.0"), for NUMA topology hints.
	PCIBusID string
}

// SkippedGPU is a GPU that NVML lists but the plugin cannot share, so it is
// neither advertised nor watched.
type SkippedGPU struct {
	Index  int    // NVML index
	UUID   string // NVML UUID
	Model  string // NVML product name
	Reason string // why it is skipped, for logs and the node's annotation
}

// ReasonMIG is the Reason of a GPU skipped because MIG mode is on: its memory
// belongs to MIG instances, and a container given the whole GPU by index
// could use none of it.
const ReasonMIG = "MIG mode is enabled; gpushare shares whole GPUs, not MIG instances"

// Library is the plugin's view of NVML: the GPUs, their health and their
// compute mode (which the MPS isolation tier changes).
type Library interface {
	// Name is the backend string it was built from, for logs and the node description.
	Name() string
	// Simulated reports whether the GPUs are mocks, so callers can say so.
	Simulated() bool
	// Devices lists the GPUs that can be shared, in NVML index order; GPUs
	// in MIG mode are left out (and logged). It fails when NVML lists no
	// GPU at all, and succeeds with none when every GPU is left out.
	Devices() ([]GPU, error)
	// Skipped returns the GPUs the latest successful Devices call left out
	// and why; nil before the first call.
	Skipped() []SkippedGPU
	// WatchHealth sends unhealthy-GPU events to events until ctx ends or Shutdown.
	WatchHealth(ctx context.Context, opts HealthOptions, events chan<- HealthEvent) error
	// ComputeMode reads the compute mode of the GPU with the given UUID.
	ComputeMode(uuid string) (ComputeMode, error)
	// SetComputeMode sets the compute mode of the GPU with the given UUID.
	// NVML needs root for it (ErrNoPermission otherwise); the mode lasts
	// until changed again or the machine reboots (it then resets to DEFAULT).
	SetComputeMode(uuid string, mode ComputeMode) error
	// Topology reads how the GPUs Devices lists are connected: each one's
	// PCI bus ID, NUMA node and NVLink links to NVSwitches, and every pair's
	// PCIe common ancestor and NVLink link count (plugin/topology scores it).
	Topology() (topology.Reading, error)
	// Usage reads each shareable GPU's memory in use, utilisation and the
	// processes holding memory on it (plugin/usage attributes them to
	// containers).
	Usage() ([]Usage, error)
	// DriverVersion is the NVIDIA driver's version as NVML gives it (e.g.
	// "550.54.15"); "" when NVML could not read it.
	DriverVersion() string
	// Shutdown waits for in-flight calls and watchers, then releases NVML; repeat calls are no-ops.
	Shutdown() error
}

// Backends lists every backend string New accepts, for flag help and errors.
func Backends() []string {
	out := []string{BackendNVML}
	for _, m := range simulatedMachines() {
		out = append(out, simulatedPrefix+m.name)
	}
	return out
}

// New opens the backend named by backend (see Backends). For "nvml" it loads
// and initialises the real library and fails with ErrLibraryNotFound when the
// driver's library is absent; it never substitutes a simulated machine.
func New(logger *zap.Logger, backend string) (Library, error) {
	if logger == nil {
		logger = zap.NewNop()
	}
	if backend == BackendNVML {
		return newReal(logger)
	}
	if strings.HasPrefix(backend, simulatedPrefix) {
		return NewSimulator(logger, backend)
	}
	return nil, unknownBackend(backend)
}

// unknownBackend builds the error for a bad backend string, listing the good ones.
func unknownBackend(backend string) error {
	return fmt.Errorf("%w %q: valid backends are %s", ErrUnknownBackend, backend, strings.Join(Backends(), ", "))
}

// newReal loads libnvidia-ml.so.1 and initialises NVML.
func newReal(logger *zap.Logger) (Library, error) {
	l, err := openLibrary(logger, BackendNVML, nvml.New(), false)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// openLibrary initialises iface, real or mock, and wraps it; the error
// mapping lives here so the mocks can test it.
func openLibrary(logger *zap.Logger, name string, iface nvml.Interface, simulated bool) (*library, error) {
	switch ret := iface.Init(); ret {
	case nvml.SUCCESS:
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return nil, fmt.Errorf("init NVML: %w: the NVIDIA driver's libnvidia-ml.so.1 was not found on the loader path "+
			"(install the driver, or run the plugin with the NVIDIA container runtime); "+
			"a simulated backend is only used when selected explicitly", ErrLibraryNotFound)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return nil, fmt.Errorf("init NVML: libnvidia-ml.so.1 was found but the NVIDIA kernel driver is not loaded: %w",
			newCallError("nvmlInit", ret))
	default:
		return nil, fmt.Errorf("init NVML: %w", newCallError("nvmlInit", ret))
	}
	return newLibrary(logger, name, iface, simulated), nil
}

// library is the single implementation over nvml.Interface that both the real
// library and the simulated machines plug into.
type library struct {
	log       *zap.Logger
	name      string
	simulated bool
	iface     nvml.Interface

	// mu guards closed and the Add side of calls, so Shutdown never races a
	// call that is just starting.
	mu     sync.Mutex
	closed bool
	// stop is closed by Shutdown so running watchers return within one wait.
	stop chan struct{}
	// calls counts in-flight calls and watchers; Shutdown waits for them
	// because the real library must not be used after nvmlShutdown.
	calls sync.WaitGroup
	// skipped is what the latest successful Devices call left out; guarded by mu.
	skipped []SkippedGPU
	// numa reads the NUMA node of the GPU with the given sysfs bus ID (-1
	// when unknown); sysfs for the real library, the profile when simulated.
	numa func(busID string) int
	// driver is the driver version read at start; "" when unknown.
	driver string
}

// newLibrary wraps an initialised nvml.Interface.
func newLibrary(logger *zap.Logger, name string, iface nvml.Interface, simulated bool) *library {
	l := &library{
		log:       logger.With(zap.String("nvmlBackend", name), zap.Bool("simulated", simulated)),
		name:      name,
		simulated: simulated,
		iface:     iface,
		stop:      make(chan struct{}),
		numa:      readSysfsNUMA,
	}
	driver, ret := iface.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		l.log.Info("NVML initialised; driver version unknown", zap.Error(newCallError("get driver version", ret)))
	} else {
		l.driver = driver
		l.log.Info("NVML initialised", zap.String("driverVersion", driver))
	}
	return l
}

// DriverVersion implements Library.
func (l *library) DriverVersion() string { return l.driver }

// Name implements Library.
func (l *library) Name() string { return l.name }

// Simulated implements Library.
func (l *library) Simulated() bool { return l.simulated }

// enter registers an NVML call in flight, refusing once Shutdown has begun.
func (l *library) enter() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrShutdown
	}
	l.calls.Add(1)
	return nil
}

// Shutdown implements Library.
func (l *library) Shutdown() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.stop)
	l.mu.Unlock()

	l.calls.Wait()
	if ret := l.iface.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("shut down NVML: %w", newCallError("nvmlShutdown", ret))
	}
	l.log.Info("NVML shut down")
	return nil
}

// Devices implements Library.
func (l *library) Devices() ([]GPU, error) {
	if err := l.enter(); err != nil {
		return nil, err
	}
	defer l.calls.Done()
	gpus, _, skipped, err := l.devices()
	if err != nil {
		return nil, err
	}
	for _, s := range skipped {
		l.log.Warn("GPU skipped: not advertised and not watched", zap.Int("index", s.Index), zap.String("uuid", s.UUID),
			zap.String("model", s.Model), zap.String("reason", s.Reason))
	}
	l.mu.Lock()
	l.skipped = skipped
	l.mu.Unlock()
	return gpus, nil
}

// Skipped implements Library.
func (l *library) Skipped() []SkippedGPU {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.skipped)
}

// devices lists the GPUs that can be shared, with their NVML handles, and
// the GPUs it skips; the caller holds enter.
func (l *library) devices() ([]GPU, []nvml.Device, []SkippedGPU, error) {
	count, ret := l.iface.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, nil, nil, fmt.Errorf("list GPUs: %w", newCallError("get device count", ret))
	}
	if count == 0 {
		return nil, nil, nil, errors.New("list GPUs: NVML found no GPU")
	}
	gpus := make([]GPU, 0, count)
	handles := make([]nvml.Device, 0, count)
	var skipped []SkippedGPU
	for i := range count {
		dev, ret := l.iface.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, nil, nil, fmt.Errorf("list GPUs: %w", newCallError(fmt.Sprintf("GPU %d: get handle", i), ret))
		}
		if dev == nil {
			return nil, nil, nil, fmt.Errorf("list GPUs: GPU %d: get handle returned no device", i)
		}
		gpu, err := describe(i, dev)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("list GPUs: %w", err)
		}
		mig, err := migEnabled(i, dev)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("list GPUs: %w", err)
		}
		if mig {
			skipped = append(skipped, SkippedGPU{Index: i, UUID: gpu.UUID, Model: gpu.Model, Reason: ReasonMIG})
			continue
		}
		gpus = append(gpus, gpu)
		handles = append(handles, dev)
	}
	return gpus, handles, skipped, nil
}

// migEnabled reports whether the GPU at index is in MIG mode now. A pending
// change takes effect only at the next GPU reset, so only the current mode
// counts; GPUs without MIG answer NOT_SUPPORTED.
func migEnabled(index int, dev nvml.Device) (bool, error) {
	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		return current == nvml.DEVICE_MIG_ENABLE, nil
	case nvml.ERROR_NOT_SUPPORTED:
		return false, nil
	default:
		return false, newCallError(fmt.Sprintf("GPU %d: get MIG mode", index), ret)
	}
}

// describe reads the properties of the GPU at index.
func describe(index int, dev nvml.Device) (GPU, error) {
	fail := func(what string, ret nvml.Return) error {
		return newCallError(fmt.Sprintf("GPU %d: get %s", index, what), ret)
	}
	gpu := GPU{Index: index}
	var ret nvml.Return
	if gpu.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
		return GPU{}, fail("UUID", ret)
	}
	if gpu.UUID == "" {
		return GPU{}, fmt.Errorf("GPU %d: get UUID: empty UUID", index)
	}
	if gpu.Model, ret = dev.GetName(); ret != nvml.SUCCESS {
		return GPU{}, fail("name", ret)
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return GPU{}, fail("memory info", ret)
	}
	gpu.MemoryMiB = mem.Total / (1 << 20)
	if gpu.Minor, ret = dev.GetMinorNumber(); ret != nvml.SUCCESS {
		return GPU{}, fail("minor number", ret)
	}
	pci, ret := dev.GetPciInfo()
	if ret != nvml.SUCCESS {
		return GPU{}, fail("PCI info", ret)
	}
	gpu.PCIBusID = sysfsBusID(cString(pci.BusId[:]))
	return gpu, nil
}

// cString converts a NUL-terminated C char array to a Go string.
func cString(chars []int8) string {
	var b strings.Builder
	for _, c := range chars {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

// sysfsBusID turns NVML's "00000000:3B:00.0" into sysfs's "0000:3b:00.0",
// the form /sys/bus/pci/devices uses, where the GPU's NUMA node is found.
func sysfsBusID(id string) string {
	id = strings.ToLower(id)
	if domain, rest, ok := strings.Cut(id, ":"); ok && len(domain) == 8 && strings.HasPrefix(domain, "0000") {
		return domain[4:] + ":" + rest
	}
	return id
}
