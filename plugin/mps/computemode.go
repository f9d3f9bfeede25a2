package mps

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpushare/gpushare/plugin/nvml"
	"go.uber.org/zap"
)

const (
	// recordFile, in LogDir, holds the compute modes gpushare changed.
	recordFile = "gpushare-compute-modes.json"
	// bootIDFile changes at every boot; NVIDIA resets compute modes at boot,
	// so a record from another boot no longer describes the GPUs.
	bootIDFile = "/proc/sys/kernel/random/boot_id"
)

// modeRecord is the record file: each changed GPU's mode before gpushare
// switched it to EXCLUSIVE_PROCESS.
type modeRecord struct {
	BootID string `json:"bootID"`
	// Modes maps GPU UUID to the nvml.ComputeMode value, with its name beside
	// it for whoever reads the file.
	Modes map[string]recordedMode `json:"modes"`
}

// recordedMode is one GPU's mode before gpushare changed it.
type recordedMode struct {
	Mode nvml.ComputeMode `json:"mode"`
	Name string           `json:"name"`
}

// ensureModes puts every tier GPU in EXCLUSIVE_PROCESS, recording (and
// writing to disk, before any change) the mode of each GPU it has not
// recorded yet. The caller holds mu.
func (d *Daemon) ensureModes() error {
	rec, err := d.record()
	if err != nil {
		return err
	}
	var change []string
	for _, uuid := range d.cfg.GPUs {
		mode, err := d.cfg.Lib.ComputeMode(uuid)
		if err != nil {
			return fmt.Errorf("read compute mode: %w", err)
		}
		if _, ok := rec.Modes[uuid]; !ok {
			rec.Modes[uuid] = recordedMode{Mode: mode, Name: mode.String()}
		}
		if mode != nvml.ComputeModeExclusiveProcess {
			change = append(change, uuid)
		}
	}
	if len(change) == 0 {
		return nil
	}
	if err := d.saveRecord(rec); err != nil {
		return err
	}
	for _, uuid := range change {
		if err := d.cfg.Lib.SetComputeMode(uuid, nvml.ComputeModeExclusiveProcess); err != nil {
			return fmt.Errorf("MPS needs its GPUs in EXCLUSIVE_PROCESS compute mode: %w", permissionHint(err))
		}
	}
	return nil
}

// restoreModes sets every recorded GPU back to its recorded mode and deletes
// the record; GPUs it cannot restore stay recorded for the next Stop. The
// caller holds mu.
func (d *Daemon) restoreModes() error {
	rec, err := d.record()
	if err != nil {
		return err
	}
	var errs []error
	for uuid, want := range rec.Modes {
		if err := d.restore(uuid, want.Mode); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(rec.Modes, uuid)
	}
	if len(rec.Modes) > 0 {
		return errors.Join(append(errs, d.saveRecord(rec))...)
	}
	if err := os.Remove(d.recordPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove compute-mode record: %w", err)
	}
	return nil
}

// restore sets one GPU to mode unless it is already there.
func (d *Daemon) restore(uuid string, mode nvml.ComputeMode) error {
	now, err := d.cfg.Lib.ComputeMode(uuid)
	if err != nil {
		return fmt.Errorf("restore compute mode: %w", err)
	}
	if now == mode {
		return nil
	}
	if err := d.cfg.Lib.SetComputeMode(uuid, mode); err != nil {
		return fmt.Errorf("restore compute mode: %w", permissionHint(err))
	}
	d.log.Info("GPU compute mode restored", zap.String("uuid", uuid), zap.Stringer("mode", mode))
	return nil
}

// checkModes fails when a tier GPU left EXCLUSIVE_PROCESS.
func (d *Daemon) checkModes() error {
	for _, uuid := range d.cfg.GPUs {
		mode, err := d.cfg.Lib.ComputeMode(uuid)
		if err != nil {
			return fmt.Errorf("read compute mode: %w", err)
		}
		if mode != nvml.ComputeModeExclusiveProcess {
			return fmt.Errorf("GPU %s is in compute mode %v, not EXCLUSIVE_PROCESS: a process that bypasses MPS "+
				"could use it without a limit (was it changed with nvidia-smi -c?); Start sets it again", uuid, mode)
		}
	}
	return nil
}

// record returns the in-memory record, reading the file the first time. A
// record from an earlier boot is dropped.
func (d *Daemon) record() (*modeRecord, error) {
	if d.modes != nil {
		return d.modes, nil
	}
	boot := bootID()
	rec := &modeRecord{BootID: boot, Modes: map[string]recordedMode{}}
	data, err := os.ReadFile(d.recordPath())
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("read compute-mode record: %w", err)
	default:
		var found modeRecord
		if err := json.Unmarshal(data, &found); err != nil {
			return nil, fmt.Errorf("compute-mode record %s is corrupt (%w): check the GPUs' modes with nvidia-smi, then remove it", d.recordPath(), err)
		}
		if found.BootID == boot && len(found.Modes) > 0 {
			rec.Modes = found.Modes
			d.log.Info("compute modes recorded by an earlier run", zap.Any("modes", found.Modes))
		}
	}
	d.modes = rec
	return rec, nil
}

// saveRecord writes rec atomically (temporary file, then rename).
func (d *Daemon) saveRecord(rec *modeRecord) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	tmp := d.recordPath() + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("write compute-mode record: %w", err)
	}
	if err := os.Rename(tmp, d.recordPath()); err != nil {
		return fmt.Errorf("write compute-mode record: %w", err)
	}
	return nil
}

func (d *Daemon) recordPath() string { return filepath.Join(d.cfg.LogDir, recordFile) }

// bootID identifies this boot; empty when unknown, which matches only
// another unknown.
func bootID() string {
	data, err := os.ReadFile(bootIDFile)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// permissionHint adds what to do when NVML refused for want of root.
func permissionHint(err error) error {
	if errors.Is(err, nvml.ErrNoPermission) {
		return fmt.Errorf("%w (NVML changes compute modes only for root: run the device plugin privileged, as NVIDIA runs its MPS daemon)", err)
	}
	return err
}
