package nvml

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// sentinelError is a constant error type, so the package's sentinels cannot be
// reassigned (no package-level mutable state) yet still work with errors.Is.
type sentinelError string

// Error returns the sentinel's text.
func (e sentinelError) Error() string { return string(e) }

const (
	// ErrLibraryNotFound means libnvidia-ml.so.1 could not be loaded; callers
	// (and TestRealNVML) use it to tell "no NVIDIA driver here" from a broken one.
	ErrLibraryNotFound sentinelError = "NVML library libnvidia-ml.so.1 not found"
	// ErrNotSupported means the GPU or driver does not offer the requested NVML
	// call; old or virtual GPUs lack some queries and event types.
	ErrNotSupported sentinelError = "not supported by this GPU or driver"
	// ErrShutdown is returned by calls made after Shutdown, because touching the
	// real library after it is unloaded would crash the process.
	ErrShutdown sentinelError = "NVML library already shut down"
	// ErrUnknownBackend is returned by New for a backend string it does not know.
	ErrUnknownBackend sentinelError = "unknown NVML backend"
	// ErrNoPermission means NVML refused a change that needs root (such as a
	// compute mode), so callers can tell the operator what the process lacks.
	ErrNoPermission sentinelError = "not permitted: NVML needs root for this change"
)

// callError is a failed NVML call. Its text is rendered when it is created,
// because nvml.Return.Error consults go-nvml's library state, which Shutdown
// changes; Unwrap still yields the nvml.Return for errors.Is inside this package.
type callError struct {
	op  string
	ret nvml.Return
	msg string
}

// newCallError wraps ret, the result of the NVML call described by op.
func newCallError(op string, ret nvml.Return) error {
	return &callError{op: op, ret: ret, msg: ret.Error()}
}

// Error says which call failed and NVML's reason.
func (e *callError) Error() string { return e.op + ": " + e.msg }

// Unwrap exposes the raw nvml.Return.
func (e *callError) Unwrap() error { return e.ret }

// Is maps NVML codes callers care about onto this package's sentinels, so
// they need not import go-nvml.
func (e *callError) Is(target error) bool {
	switch target {
	case ErrNotSupported:
		return e.ret == nvml.ERROR_NOT_SUPPORTED
	case ErrLibraryNotFound:
		return e.ret == nvml.ERROR_LIBRARY_NOT_FOUND
	case ErrNoPermission:
		return e.ret == nvml.ERROR_NO_PERMISSION
	}
	return false
}
