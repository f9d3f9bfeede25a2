package main

import (
	"context"
	"io"
	"testing"

	"go.uber.org/zap/zapcore"

	"github.com/gpushare/gpushare/extender/allocator"
)

func TestParse(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	o, err := parse(nil, env(nil), io.Discard)
	if err != nil || o.listen != ":12345" || o.logLevel != zapcore.InfoLevel || o.policy != allocator.BestFit || o.qps < 500 {
		t.Fatalf("defaults = %+v, %v", o, err)
	}
	o, err = parse(nil, env(map[string]string{"PORT": "39999", "LOG_LEVEL": "debug"}), io.Discard)
	if err != nil || o.listen != ":39999" || o.logLevel != zapcore.DebugLevel {
		t.Fatalf("env fallbacks = %+v, %v", o, err)
	}
	// Flags win over the environment.
	o, err = parse([]string{"-listen=127.0.0.1:1", "-log-level=warn", "-policy=spread"}, env(map[string]string{"PORT": "39999", "LOG_LEVEL": "debug"}), io.Discard)
	if err != nil || o.listen != "127.0.0.1:1" || o.logLevel != zapcore.WarnLevel || o.policy != allocator.Spread {
		t.Fatalf("flags = %+v, %v", o, err)
	}
	for _, bad := range [][]string{{"-policy=random"}, {"-kube-api-qps=0"}, {"extra"}} {
		if _, err := parse(bad, env(nil), io.Discard); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
	if _, err := parse(nil, env(map[string]string{"LOG_LEVEL": "loud"}), io.Discard); err == nil {
		t.Error("bad LOG_LEVEL accepted")
	}
}

func TestRunFailsClearlyWithoutCluster(t *testing.T) {
	// Outside a cluster and without -kubeconfig, the error names the cause.
	err := run(context.Background(), []string{"-kubeconfig=/nonexistent"}, func(string) string { return "" }, io.Discard)
	if err == nil {
		t.Fatal("run succeeded without a cluster")
	}
}
