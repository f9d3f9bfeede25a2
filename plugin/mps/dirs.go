package mps

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"go.uber.org/zap"
)

const (
	// dirMode lets clients (and MPS servers of the daemon's user) traverse
	// the pipe directory, and only the daemon's user write in it.
	dirMode = 0o755
	// defaultSELinuxFS is where selinuxfs is normally mounted.
	defaultSELinuxFS = "/sys/fs/selinux"
	// containerFileType is the SELinux type containers may use; NVIDIA's
	// device plugin gives its pipe directory the same one.
	containerFileType = "container_file_t"
)

// prepareDirs creates the pipe and log directories, sets their mode (a
// directory made by someone else may be 0700, which non-root MPS servers
// cannot traverse), gives them to RunAs, and labels the pipe directory for
// containers when SELinux is on.
func (d *Daemon) prepareDirs() error {
	for _, dir := range []string{d.cfg.PipeDir, d.cfg.LogDir} {
		if err := d.prepareDir(dir); err != nil {
			return err
		}
	}
	return d.labelForContainers(d.cfg.PipeDir)
}

// prepareDir makes one directory ready; it refuses a symbolic link, whose
// target (anywhere on the host) would otherwise be chmodded and chowned.
func (d *Daemon) prepareDir(dir string) error {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("MPS directory: %w", err)
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("MPS directory: %w", err)
	}
	if !info.IsDir() {
		return fmt.Errorf("MPS directory %s is not a directory (%v)", dir, info.Mode().Type())
	}
	if err := os.Chmod(dir, dirMode); err != nil {
		return fmt.Errorf("MPS directory: %w", err)
	}
	if c := d.cfg.RunAs; c != nil {
		if err := os.Chown(dir, int(c.UID), int(c.GID)); err != nil {
			return fmt.Errorf("MPS directory for uid %d: %w", c.UID, err)
		}
	}
	return nil
}

// labelForContainers gives dir the SELinux type containers may use, when
// SELinux is enabled: without it a confined container is denied the sockets
// (NVIDIA/k8s-device-plugin#789, #847). Only the directory: what the daemon
// creates in it inherits the type, and relabelling entries would follow a
// link a client planted. A failure stops Start only when SELinux enforces;
// in permissive mode nothing is denied, so it is logged.
func (d *Daemon) labelForContainers(dir string) error {
	fs := d.cfg.SELinuxFS
	if fs == "" {
		fs = defaultSELinuxFS
	}
	enforce, err := os.ReadFile(filepath.Join(fs, "enforce"))
	if err != nil {
		return nil // SELinux is off, or not visible in this container
	}
	err = relabel(dir)
	switch {
	case err == nil:
		d.log.Info("SELinux: MPS pipe directory typed for containers", zap.String("type", containerFileType))
	case strings.TrimSpace(string(enforce)) != "1":
		d.log.Warn("SELinux is permissive; the MPS pipe directory keeps its label", zap.Error(err))
	default:
		return err
	}
	return nil
}

// relabel sets dir's SELinux type to containerFileType.
func relabel(dir string) error {
	current, err := getLabel(dir)
	if err != nil {
		return fmt.Errorf("SELinux label of %s: %w", dir, err)
	}
	want, err := withType(current, containerFileType)
	if err != nil || want == current {
		return err
	}
	if err := setLabel(dir, want); err != nil {
		return fmt.Errorf("SELinux: label %s %s: %w", dir, want, err)
	}
	return nil
}

// withType replaces the type field of an SELinux context
// ("user:role:type:level", the level possibly holding colons).
func withType(context, typ string) (string, error) {
	parts := strings.SplitN(strings.TrimRight(context, "\x00\n"), ":", 4)
	if len(parts) < 3 || parts[2] == "" {
		return "", errors.New("unexpected SELinux context " + fmt.Sprintf("%q", context))
	}
	parts[2] = typ
	return strings.Join(parts, ":"), nil
}

// selinuxXattr holds a file's SELinux context.
const selinuxXattr = "security.selinux"

// getLabel reads path's SELinux context.
func getLabel(path string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := syscall.Getxattr(path, selinuxXattr, buf)
		if err == syscall.ERANGE {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// setLabel writes path's SELinux context.
func setLabel(path, label string) error {
	return syscall.Setxattr(path, selinuxXattr, []byte(label), 0)
}
