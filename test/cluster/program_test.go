package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The build directories of processes that ended are removed; this process's and other names stay.
func TestRemoveStaleOwnBuilds(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ended := exec.Command("true")
	if err := ended.Run(); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]bool{ // name -> kept
		fmt.Sprintf("%s%d-1", ownPrefix, ended.Process.Pid): false,
		fmt.Sprintf("%s%d-2", ownPrefix, os.Getpid()):       true,
		fmt.Sprintf("%s%d-3", ownPrefix, os.Getppid()):      true, // alive: the go command or a shell
		ownPrefix + "notapid-4":                             true,
		"unrelated":                                         true,
	}
	for name := range dirs {
		if err := os.Mkdir(filepath.Join(tmp, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	removeStaleOwnBuilds()
	for name, kept := range dirs {
		_, err := os.Stat(filepath.Join(tmp, name))
		if exists := err == nil; exists != kept {
			t.Errorf("%s: exists %v, want %v", name, exists, kept)
		}
	}
}

func TestLinkOrCopy(t *testing.T) {
	dir := t.TempDir()
	from := filepath.Join(dir, "bin")
	if err := os.WriteFile(from, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	to := filepath.Join(dir, "sub", "bin")
	if err := os.Mkdir(filepath.Dir(to), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := linkOrCopy(from, to); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(to)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o100 == 0 || fi.Size() != int64(len("#!/bin/sh\n")) {
		t.Errorf("%s: mode %v, size %d; want an executable copy of %s", to, fi.Mode(), fi.Size(), from)
	}
}
