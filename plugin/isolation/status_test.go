package isolation_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/isolation"
)

func TestNodeTier(t *testing.T) {
	for _, tt := range []struct {
		flag   gpushare.Isolation
		labels map[string]string
		want   gpushare.Isolation
		err    bool
	}{
		{gpushare.IsolationNone, nil, gpushare.IsolationNone, false},
		{gpushare.IsolationMPS, map[string]string{"other": "x"}, gpushare.IsolationMPS, false},
		{gpushare.IsolationNone, map[string]string{"gpushare.io/isolation": "hami-core"}, gpushare.IsolationHAMiCore, false},
		{gpushare.IsolationMPS, map[string]string{"gpushare.io/isolation": "none"}, gpushare.IsolationNone, false},
		// A typo enforces nothing silently: it is an error, not the flag.
		{gpushare.IsolationNone, map[string]string{"gpushare.io/isolation": "mpss"}, "", true},
		{gpushare.IsolationNone, map[string]string{"gpushare.io/isolation": "any"}, "", true},
		{gpushare.IsolationNone, map[string]string{"gpushare.io/isolation": " mps"}, "", true},
		{gpushare.IsolationNone, map[string]string{"gpushare.io/isolation": ""}, "", true},
	} {
		got, err := isolation.NodeTier(tt.flag, tt.labels)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("NodeTier(%q, %v) = %q, %v", tt.flag, tt.labels, got, err)
		}
	}
}

func TestStatusEffective(t *testing.T) {
	for _, tt := range []struct {
		s    isolation.Status
		want gpushare.Isolation
	}{
		{isolation.Status{}, gpushare.IsolationNone},
		{isolation.Status{Tier: gpushare.IsolationMPS}, gpushare.IsolationMPS},
		{isolation.Status{Tier: gpushare.IsolationMPS, Down: true}, gpushare.IsolationNone},
		{isolation.Status{Tier: gpushare.IsolationHAMiCore}, gpushare.IsolationHAMiCore},
	} {
		if got := tt.s.Effective(); got != tt.want {
			t.Errorf("%+v.Effective() = %q; want %q", tt.s, got, tt.want)
		}
	}
}

// fakeDaemon answers Healthy with err.
type fakeDaemon struct{ err error }

func (d *fakeDaemon) Start(context.Context) error   { return nil }
func (d *fakeDaemon) Healthy(context.Context) error { return d.err }
func (d *fakeDaemon) Stop(context.Context) error    { return nil }
func (d *fakeDaemon) PipeDir() string               { return cfg.MPSPipeDir }

func TestProbeMPS(t *testing.T) {
	ctx := t.Context()
	d := &fakeDaemon{}
	p := isolation.Prober{Config: cfg, MPS: d}
	if s := p.Probe(ctx, gpushare.IsolationMPS); s != (isolation.Status{Tier: gpushare.IsolationMPS}) {
		t.Errorf("daemon answering: %+v", s)
	}
	d.err = errors.New("connection refused")
	if s := p.Probe(ctx, gpushare.IsolationMPS); !s.Down || s.Tier != gpushare.IsolationMPS || !strings.Contains(s.Reason, "connection refused") {
		t.Errorf("daemon silent: %+v", s)
	}
	if s := (isolation.Prober{Config: cfg}).Probe(ctx, gpushare.IsolationMPS); !s.Down || !strings.Contains(s.Reason, "no MPS control daemon") {
		t.Errorf("no daemon: %+v", s)
	}
	// Tier none needs nothing, whatever the daemon does.
	if s := p.Probe(ctx, gpushare.IsolationNone); s != (isolation.Status{Tier: gpushare.IsolationNone}) {
		t.Errorf("none: %+v", s)
	}
	if s := p.Probe(ctx, "cgpu"); !s.Down {
		t.Errorf("unknown tier: %+v", s)
	}
}

// hamiFiles lays out a working hami-core host under a temporary root.
func hamiFiles(t *testing.T) isolation.Config {
	t.Helper()
	root := t.TempDir()
	c := isolation.Config{
		HAMiLibrary: filepath.Join(root, "libvgpu.so.v2"), HAMiPreload: filepath.Join(root, "ld.so.preload"),
		HAMiLockDir: filepath.Join(root, "vgpulock"), HAMiCacheRoot: filepath.Join(root, "cache"),
	}
	for _, err := range []error{
		os.WriteFile(c.HAMiLibrary, []byte("\x7fELF"), 0o644),
		os.WriteFile(c.HAMiPreload, []byte("/usr/local/vgpu/libvgpu.so\n"), 0o644),
		os.Mkdir(c.HAMiLockDir, 0o777), os.Mkdir(c.HAMiCacheRoot, 0o755),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return c
}

func TestProbeHAMiCore(t *testing.T) {
	ctx := t.Context()
	c := hamiFiles(t)
	if s := (isolation.Prober{Config: c}).Probe(ctx, gpushare.IsolationHAMiCore); s.Down {
		t.Fatalf("all files in place: %+v", s)
	}
	for _, tt := range []struct {
		name  string
		spoil func(c isolation.Config) error
		want  string
	}{
		{"library gone", func(c isolation.Config) error { return os.Remove(c.HAMiLibrary) }, "library"},
		{"library empty", func(c isolation.Config) error { return os.WriteFile(c.HAMiLibrary, nil, 0o644) }, "library"},
		{"library a directory", func(c isolation.Config) error {
			if err := os.Remove(c.HAMiLibrary); err != nil {
				return err
			}
			return os.Mkdir(c.HAMiLibrary, 0o755)
		}, "library"},
		{"preload gone", func(c isolation.Config) error { return os.Remove(c.HAMiPreload) }, "preload"},
		{"preload names another path", func(c isolation.Config) error {
			return os.WriteFile(c.HAMiPreload, []byte("/usr/local/vgpu/libvgpu.so.v2\n"), 0o644)
		}, "does not name /usr/local/vgpu/libvgpu.so"},
		{"lock directory gone", func(c isolation.Config) error { return os.Remove(c.HAMiLockDir) }, "vgpulock"},
		{"cache root gone", func(c isolation.Config) error { return os.Remove(c.HAMiCacheRoot) }, "cache"},
	} {
		c := hamiFiles(t)
		if err := tt.spoil(c); err != nil {
			t.Fatal(err)
		}
		s := (isolation.Prober{Config: c}).Probe(ctx, gpushare.IsolationHAMiCore)
		if !s.Down || s.Tier != gpushare.IsolationHAMiCore || !strings.Contains(s.Reason, tt.want) {
			t.Errorf("%s: %+v; want down naming %q", tt.name, s, tt.want)
		}
	}
	// Several libraries on one line, colon- or space-separated, as ld.so reads them.
	c = hamiFiles(t)
	if err := os.WriteFile(c.HAMiPreload, []byte("/lib/other.so:/usr/local/vgpu/libvgpu.so /lib/third.so"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := isolation.HAMiFilesReady(c); err != nil {
		t.Errorf("a preload list naming the library among others: %v", err)
	}
	if err := isolation.HAMiFilesReady(isolation.Config{}); err == nil {
		t.Error("no paths configured: ready")
	}
}
