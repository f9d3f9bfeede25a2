package nvml

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"
)

// ComputeMode is a GPU's compute mode (nvmlComputeMode_t): which processes
// may create CUDA contexts on it. The MPS isolation tier needs
// ComputeModeExclusiveProcess, so that only the MPS server, never a client
// that bypasses MPS, holds a context on the GPU.
type ComputeMode int

const (
	// ComputeModeDefault lets any number of processes create contexts.
	ComputeModeDefault = ComputeMode(nvml.COMPUTEMODE_DEFAULT)
	// ComputeModeExclusiveThread is deprecated by NVIDIA; listed so a GPU
	// found in it can be named and restored.
	ComputeModeExclusiveThread = ComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_THREAD)
	// ComputeModeProhibited lets no process create a context.
	ComputeModeProhibited = ComputeMode(nvml.COMPUTEMODE_PROHIBITED)
	// ComputeModeExclusiveProcess lets one process (under MPS: the MPS
	// server) hold contexts on the GPU.
	ComputeModeExclusiveProcess = ComputeMode(nvml.COMPUTEMODE_EXCLUSIVE_PROCESS)
)

// String returns nvidia-smi's name for the mode ("EXCLUSIVE_PROCESS"), so logs
// and errors read like the tool operators know.
func (m ComputeMode) String() string {
	switch m {
	case ComputeModeDefault:
		return "DEFAULT"
	case ComputeModeExclusiveThread:
		return "EXCLUSIVE_THREAD"
	case ComputeModeProhibited:
		return "PROHIBITED"
	case ComputeModeExclusiveProcess:
		return "EXCLUSIVE_PROCESS"
	}
	return fmt.Sprintf("ComputeMode(%d)", int(m))
}

// valid reports whether m is a mode NVML can set.
func (m ComputeMode) valid() bool {
	return m >= ComputeModeDefault && m < ComputeMode(nvml.COMPUTEMODE_COUNT)
}

// ComputeMode implements Library.
func (l *library) ComputeMode(uuid string) (ComputeMode, error) {
	if err := l.enter(); err != nil {
		return 0, err
	}
	defer l.calls.Done()
	dev, err := l.deviceByUUID(uuid)
	if err != nil {
		return 0, err
	}
	mode, ret := dev.GetComputeMode()
	if ret != nvml.SUCCESS {
		return 0, newCallError(fmt.Sprintf("GPU %s: get compute mode", uuid), ret)
	}
	return ComputeMode(mode), nil
}

// SetComputeMode implements Library.
func (l *library) SetComputeMode(uuid string, mode ComputeMode) error {
	if !mode.valid() {
		return fmt.Errorf("GPU %s: set compute mode: %v is not a compute mode", uuid, mode)
	}
	if err := l.enter(); err != nil {
		return err
	}
	defer l.calls.Done()
	dev, err := l.deviceByUUID(uuid)
	if err != nil {
		return err
	}
	if ret := dev.SetComputeMode(nvml.ComputeMode(mode)); ret != nvml.SUCCESS {
		return newCallError(fmt.Sprintf("GPU %s: set compute mode %v", uuid, mode), ret)
	}
	l.log.Info("GPU compute mode set", zap.String("uuid", uuid), zap.Stringer("mode", mode))
	return nil
}

// deviceByUUID finds a GPU by UUID; the caller holds enter. UUIDs, not
// indices, because indices can change across reboots and the callers keep
// GPUs by UUID.
func (l *library) deviceByUUID(uuid string) (nvml.Device, error) {
	dev, ret := l.iface.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, newCallError(fmt.Sprintf("GPU %s: get handle", uuid), ret)
	}
	if dev == nil {
		return nil, fmt.Errorf("GPU %s: get handle returned no device", uuid)
	}
	return dev, nil
}
