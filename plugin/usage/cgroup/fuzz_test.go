package cgroup

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse checks that Parse never panics, that an error comes with a zero
// result, and that an owner, when found, is canonical.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		content, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(content)
	}
	f.Add([]byte("0::/kubepods-pod" + uidU + ".slice:cri-containerd:" + cid + "\n"))
	f.Add([]byte("0::/../../besteffort/pod" + uid + "/crio-conmon-" + cid + "\n"))
	f.Fuzz(func(t *testing.T, content []byte) {
		got, ok, err := Parse(content)
		switch {
		case err != nil && (ok || got != Owner{}):
			t.Fatalf("error %v with result %+v, %v", err, got, ok)
		case !ok && got != Owner{}:
			t.Fatalf("ok=false with owner %+v", got)
		case !ok:
			return
		}
		if !isCanonicalUUID(got.PodUID) {
			t.Errorf("PodUID %q is not a canonical UUID", got.PodUID)
		}
		if !isLowerHex(got.ContainerID, 64) {
			t.Errorf("ContainerID %q is not 64 lowercase hex digits", got.ContainerID)
		}
		switch got.QoS {
		case "", QoSGuaranteed, QoSBurstable, QoSBestEffort:
		default:
			t.Errorf("QoS %q is not a QoS class", got.QoS)
		}
	})
}

// isCanonicalUUID checks 8-4-4-4-12 lowercase hex, independently of the
// parser's own check.
func isCanonicalUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for _, n := range []int{8, 4, 4, 4, 12} {
		if !isLowerHex(s[:n], n) {
			return false
		}
		s = s[n:]
		if s != "" {
			if s[0] != '-' {
				return false
			}
			s = s[1:]
		}
	}
	return true
}

func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
