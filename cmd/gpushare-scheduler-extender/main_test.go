package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

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
	if o.assumeTTL != 90*time.Second || o.bindTimeout != 10*time.Second || o.requestTimeout != 60*time.Second {
		t.Fatalf("timing defaults = %+v", o)
	}
	if o, err := parse([]string{"-bind-timeout=20s", "-assume-ttl=1m"}, env(nil), io.Discard); err != nil || o.bindTimeout != 20*time.Second || o.assumeTTL != time.Minute {
		t.Fatalf("timing flags = %+v, %v", o, err)
	}
	for _, bad := range [][]string{{"-policy=random"}, {"-kube-api-qps=0"}, {"extra"}, {"-bind-timeout=0"}, {"-assume-ttl=-1s"}, {"-apiserver-request-timeout=0"}} {
		if _, err := parse(bad, env(nil), io.Discard); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
	if _, err := parse(nil, env(map[string]string{"LOG_LEVEL": "loud"}), io.Discard); err == nil {
		t.Error("bad LOG_LEVEL accepted")
	}
}

func TestParseLeaderElectionAndTLS(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	o, err := parse(nil, env(nil), io.Discard)
	want := election{lease: 15 * time.Second, renew: 10 * time.Second, retry: 2 * time.Second,
		resourceName: "gpushare-scheduler-extender", resourceSpace: "kube-system"}
	if err != nil || o.election != want || o.tlsCert != "" || o.debug != "" {
		t.Fatalf("defaults = %+v, %v", o, err)
	}
	o, err = parse([]string{"-leader-elect", "-leader-elect-lease-duration=3s", "-leader-elect-renew-deadline=2s", "-leader-elect-retry-period=500ms",
		"-tls-cert-file=c", "-tls-private-key-file=k", "-debug-listen=127.0.0.1:6060"}, env(map[string]string{"POD_NAMESPACE": "gpu"}), io.Discard)
	if err != nil || !o.election.enabled || o.election.lease != 3*time.Second || o.election.resourceSpace != "gpu" ||
		o.tlsCert != "c" || o.tlsKey != "k" || o.debug != "127.0.0.1:6060" {
		t.Fatalf("flags = %+v, %v", o, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-tls-cert-file=c"}, "-tls-cert-file and -tls-private-key-file go together"},
		{[]string{"-tls-private-key-file=k"}, "-tls-cert-file and -tls-private-key-file go together"},
		{[]string{"-leader-elect", "-leader-elect-renew-deadline=15s"}, "shorter than -leader-elect-lease-duration"},
		{[]string{"-leader-elect", "-leader-elect-retry-period=9s"}, "shorter than -leader-elect-renew-deadline"},
		{[]string{"-leader-elect", "-leader-elect-lease-duration=2500ms", "-leader-elect-renew-deadline=2s", "-leader-elect-retry-period=1s"}, "whole number of seconds"},
		{[]string{"-leader-elect", "-leader-elect-resource-name="}, "must not be empty"},
	} {
		if _, err := parse(c.args, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse(%q) = %v, want an error saying %q", c.args, err, c.want)
		}
	}
	// Timings are only checked when they are used.
	if _, err := parse([]string{"-leader-elect-renew-deadline=20s"}, env(nil), io.Discard); err != nil {
		t.Errorf("timings without -leader-elect: %v", err)
	}
}

func TestIdentity(t *testing.T) {
	host := func() (string, error) { return "node-7", nil }
	a, err := identity(func(k string) string { return map[string]string{"POD_NAME": "ext-abc"}[k] }, host)
	if err != nil || !strings.HasPrefix(a, "ext-abc_") {
		t.Fatalf("identity with POD_NAME = %q, %v", a, err)
	}
	b, _ := identity(func(k string) string { return map[string]string{"POD_NAME": "ext-abc"}[k] }, host)
	if a == b {
		t.Errorf("two runs of the same pod share the identity %q", a)
	}
	if c, err := identity(func(string) string { return "" }, host); err != nil || !strings.HasPrefix(c, "node-7_") {
		t.Errorf("identity without POD_NAME = %q, %v", c, err)
	}
	if _, err := identity(func(string) string { return "" }, func() (string, error) { return "", errors.New("no name") }); err == nil {
		t.Error("identity without POD_NAME or host name succeeded")
	}
}

func TestRunFailsClearlyWithoutCluster(t *testing.T) {
	// Outside a cluster and without -kubeconfig, the error names the cause.
	err := run(context.Background(), []string{"-kubeconfig=/nonexistent"}, func(string) string { return "" }, io.Discard)
	if err == nil {
		t.Fatal("run succeeded without a cluster")
	}
}
