package nvml

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap/zaptest"
)

func TestComputeModeString(t *testing.T) {
	for mode, want := range map[ComputeMode]string{
		ComputeModeDefault:          "DEFAULT",
		ComputeModeExclusiveThread:  "EXCLUSIVE_THREAD",
		ComputeModeProhibited:       "PROHIBITED",
		ComputeModeExclusiveProcess: "EXCLUSIVE_PROCESS",
		ComputeMode(7):              "ComputeMode(7)",
	} {
		if got := mode.String(); got != want {
			t.Errorf("ComputeMode(%d).String() = %q, want %q", int(mode), got, want)
		}
	}
}

// TestSimulatedComputeMode: every simulated GPU starts in DEFAULT, remembers
// what is set on it alone, and refuses what NVML refuses.
func TestSimulatedComputeMode(t *testing.T) {
	sim, err := NewSimulator(zaptest.NewLogger(t), "simulated:mixed")
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := sim.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gpus {
		if mode, err := sim.ComputeMode(g.UUID); err != nil || mode != ComputeModeDefault {
			t.Fatalf("GPU %d: ComputeMode = %v, %v; want DEFAULT", g.Index, mode, err)
		}
	}
	if err := sim.SetComputeMode(gpus[1].UUID, ComputeModeExclusiveProcess); err != nil {
		t.Fatalf("SetComputeMode: %v", err)
	}
	for _, g := range gpus {
		want := ComputeModeDefault
		if g.Index == 1 {
			want = ComputeModeExclusiveProcess
		}
		if mode, err := sim.ComputeMode(g.UUID); err != nil || mode != want {
			t.Errorf("GPU %d: ComputeMode = %v, %v; want %v", g.Index, mode, err, want)
		}
	}

	if err := sim.SetComputeMode(gpus[0].UUID, ComputeMode(4)); err == nil || !strings.Contains(err.Error(), "not a compute mode") {
		t.Errorf("SetComputeMode(4) = %v, want a refusal", err)
	}
	if _, err := sim.ComputeMode("GPU-no-such-gpu"); err == nil || !strings.Contains(err.Error(), "GPU-no-such-gpu") {
		t.Errorf("ComputeMode(unknown UUID) = %v, want an error naming it", err)
	}
	if err := sim.SetComputeMode("GPU-no-such-gpu", ComputeModeDefault); err == nil {
		t.Errorf("SetComputeMode(unknown UUID) succeeded")
	}

	if err := sim.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := sim.ComputeMode(gpus[0].UUID); !errors.Is(err, ErrShutdown) {
		t.Errorf("ComputeMode after Shutdown = %v, want ErrShutdown", err)
	}
	if err := sim.SetComputeMode(gpus[0].UUID, ComputeModeDefault); !errors.Is(err, ErrShutdown) {
		t.Errorf("SetComputeMode after Shutdown = %v, want ErrShutdown", err)
	}
}

// TestSetComputeModeNoPermission: a non-root caller gets ErrNoPermission, so
// the MPS tier can say what the plugin lacks.
func TestSetComputeModeNoPermission(t *testing.T) {
	m := newTestMachine(1)
	m.iface.DeviceGetHandleByUUIDFunc = func(uuid string) (nvml.Device, nvml.Return) {
		if uuid != testUUID(0) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return m.devs[0], nvml.SUCCESS
	}
	m.devs[0].SetComputeModeFunc = func(nvml.ComputeMode) nvml.Return { return nvml.ERROR_NO_PERMISSION }
	m.devs[0].GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	l := m.open(t)

	err := l.SetComputeMode(testUUID(0), ComputeModeExclusiveProcess)
	if !errors.Is(err, ErrNoPermission) || !strings.Contains(err.Error(), "EXCLUSIVE_PROCESS") {
		t.Errorf("SetComputeMode = %v, want ErrNoPermission naming the mode", err)
	}
	if _, err := l.ComputeMode(testUUID(0)); !errors.Is(err, ErrNotSupported) {
		t.Errorf("ComputeMode = %v, want ErrNotSupported", err)
	}
	if _, err := l.ComputeMode(testUUID(1)); err == nil || errors.Is(err, ErrNotSupported) {
		t.Errorf("ComputeMode(unknown) = %v, want a lookup error", err)
	}
}
