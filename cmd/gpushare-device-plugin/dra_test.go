package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	node := env(map[string]string{"NODE_NAME": "n1"})
	o, err := parse(nil, node, &bytes.Buffer{})
	if err != nil || o.dra.mode != modeDevicePlugin || o.dra.pluginDir != "/var/lib/kubelet/plugins/gpu-mem.gpushare.io" ||
		o.dra.registrarDir != "/var/lib/kubelet/plugins_registry" {
		t.Errorf("defaults = %+v, %v", o.dra, err)
	}
	o, err = parse([]string{"--mode=dra", "--dra-plugin-dir=/tmp/p", "--dra-registrar-dir=/tmp/r", "--device-list-strategy=cdi-cri"}, node, &bytes.Buffer{})
	if err != nil || o.dra != (draOptions{mode: modeDRA, pluginDir: "/tmp/p", registrarDir: "/tmp/r"}) {
		t.Errorf("--mode=dra flags = %+v, %v", o.dra, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--mode=both"}, `--mode: "both" is neither`},
		{[]string{"--mode=dra", "--dra-plugin-dir=rel"}, "--dra-plugin-dir"},
		{[]string{"--mode=dra", "--dra-registrar-dir=/a/../b"}, "--dra-registrar-dir"},
		{[]string{"--mode=dra", "--device-list-strategy=volume-mounts"}, "volume-mounts is not available with --mode=dra"},
	} {
		if _, err := parse(tc.args, node, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parse(%v) = %v; want an error mentioning %q", tc.args, err, tc.want)
		}
	}
	// The device-plugin mode ignores the DRA directories.
	if _, err := parse([]string{"--dra-plugin-dir=rel"}, node, &bytes.Buffer{}); err != nil {
		t.Errorf("device-plugin mode refused an unused DRA flag: %v", err)
	}
}
