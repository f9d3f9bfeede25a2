package gpushare

import (
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Unit is the size of one memory slice in MiB: one device-plugin device ID,
// one unit of aliyun.com/gpu-mem. Valid units divide a GiB evenly, so every
// GPU's memory converts the same way whatever unit an operator picks.
type Unit uint64

// The two units the old gpushare offered.
const (
	// MiB is the 1 MiB unit (old --memory-unit=MiB).
	MiB Unit = 1
	// GiB is the 1 GiB unit, the default (old --memory-unit=GiB).
	GiB Unit = 1024
)

// ParseUnit reads a unit: "GiB", "MiB", "1GiB", or "<n>MiB" where n divides
// 1024 ("1024MiB" is GiB). Anything else is a *UnitError (ErrInvalidUnit).
func ParseUnit(s string) (Unit, error) {
	switch s {
	case "GiB", "1GiB":
		return GiB, nil
	case "MiB":
		return MiB, nil
	}
	digits, ok := strings.CutSuffix(s, "MiB")
	if !ok {
		return 0, &UnitError{Value: s}
	}
	// Base 10 admits neither signs nor underscores, so only plain digits pass.
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || !Unit(n).Valid() {
		return 0, &UnitError{Value: s}
	}
	return Unit(n), nil
}

// Valid reports whether u is a positive divisor of a GiB in MiB.
func (u Unit) Valid() bool {
	return u > 0 && u <= GiB && uint64(GiB)%uint64(u) == 0
}

// MiB returns the unit's size in MiB.
func (u Unit) MiB() uint64 { return uint64(u) }

// String returns the canonical spelling: "GiB", "MiB" or "<n>MiB".
func (u Unit) String() string {
	switch u {
	case GiB:
		return "GiB"
	case MiB:
		return "MiB"
	}
	return strconv.FormatUint(uint64(u), 10) + "MiB"
}

// UnitsFromMiB returns how many whole units fit in mib, rounding down: NVML
// reports MiB, and a 16160 MiB card is 15 GiB units. An invalid unit yields 0.
func (u Unit) UnitsFromMiB(mib uint64) uint64 {
	if u == 0 {
		return 0
	}
	return mib / uint64(u)
}

// ToMiB returns the MiB in units of u, saturating instead of wrapping on overflow.
func (u Unit) ToMiB(units uint64) uint64 {
	hi, lo := bits.Mul64(units, uint64(u))
	if hi != 0 {
		return math.MaxUint64
	}
	return lo
}

// MarshalText writes the canonical spelling, so a Unit works in JSON and with flag.TextVar.
func (u Unit) MarshalText() ([]byte, error) {
	if !u.Valid() {
		return nil, &UnitError{Value: u.String()}
	}
	return []byte(u.String()), nil
}

// UnmarshalText reads a unit as ParseUnit does.
func (u *Unit) UnmarshalText(text []byte) error {
	parsed, err := ParseUnit(string(text))
	if err != nil {
		return err
	}
	*u = parsed
	return nil
}
