package gpushare

import (
	"strconv"
	"strings"
)

// The contract stores every number as a decimal string. These helpers read
// them one way everywhere: plain digits only (no sign, no spaces), bounded.

// uintString formats n in decimal.
func uintString(n uint64) string { return strconv.FormatUint(n, 10) }

// parseDigits reads a decimal of plain digits no larger than limit. On failure
// it returns a reason phrased to follow the value in a message.
func parseDigits(s string, limit uint64) (uint64, string) {
	if s == "" {
		return 0, "is empty"
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, "is not a non-negative decimal integer"
		}
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil || n > limit {
		return 0, "is above the limit of " + uintString(limit)
	}
	return n, ""
}

// parseGPUIndex reads a GPU index in [0, MaxGPUsPerNode).
func parseGPUIndex(s string) (int, string) {
	n, reason := parseDigits(s, MaxGPUsPerNode-1)
	return int(n), reason
}

// parseUnits reads a units value in [0, MaxUnits].
func parseUnits(s string) (uint64, string) {
	return parseDigits(s, MaxUnits)
}

// formatInts joins ints with commas, the form of the unhealthy-GPU list.
func formatInts(ns []int) string {
	parts := make([]string, len(ns))
	for i, n := range ns {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}
