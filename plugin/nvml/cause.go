package nvml

import "strconv"

// Cause says what a HealthEvent means for the GPU it names, and so what can
// bring the GPU back.
type Cause int

const (
	// CauseTransient is a fault the GPU can outlive without intervention; it
	// is healthy again after a quiet period without events.
	CauseTransient Cause = iota
	// CauseFatal is a fault after which the GPU needs a reset, a reboot or a
	// repair. NVML reports neither, so the GPU stays unhealthy for the life of
	// this process; a restarted plugin reads the GPUs afresh.
	CauseFatal
	// CauseUnwatched means the GPU cannot be watched, so its health is
	// unknown; it lasts until a CauseWatched event for the same GPU.
	CauseUnwatched
	// CauseWatched is no fault: the watch covers the GPU (again), or the GPU
	// supports no events and never will. It ends a CauseUnwatched.
	CauseWatched
)

// String names the cause for logs.
func (c Cause) String() string {
	switch c {
	case CauseTransient:
		return "transient"
	case CauseFatal:
		return "fatal"
	case CauseUnwatched:
		return "unwatched"
	case CauseWatched:
		return "watched"
	}
	return "Cause(" + strconv.Itoa(int(c)) + ")"
}

// DefaultFatalXids returns the Xids after which a GPU needs a reset, a
// reboot or a repair, following NVIDIA's Xid catalog and its memory-error
// management guide (the table and its sources are in docs/device-plugin.md):
// 48 (double-bit ECC), 63 and 64 (row remapping pending or failed: only a
// reset applies it), 74 (NVLink), 79 (fallen off the bus), 94 and 95
// (contained and uncontained uncorrectable ECC), 119 and 120 (GSP firmware
// timeout and error) and 154 (the driver's own "recovery action changed",
// naming a GPU reset or a reboot). A fresh slice each call.
func DefaultFatalXids() []uint64 {
	return []uint64{48, 63, 64, 74, 79, 94, 95, 119, 120, 154}
}

// XidCause classifies an Xid that is not ignored: fatal when it is in fatal
// (DefaultFatalXids plus a site's additions), transient otherwise, so an Xid
// nobody classified costs the GPU one quiet period, never its whole life.
func XidCause(xid uint64, fatal map[uint64]bool) Cause {
	if fatal[xid] {
		return CauseFatal
	}
	return CauseTransient
}
