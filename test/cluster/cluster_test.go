package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSchedulerConfigJSON(t *testing.T) {
	data, err := schedulerConfigJSON(SchedulerConfig{
		ClientQPS: 500, ClientBurst: 1000,
		Extenders: []Extender{{
			URLPrefix: "https://127.0.0.1:1234/gpushare-scheduler", FilterVerb: "filter", BindVerb: "bind",
			PrioritizeVerb: "prioritize", Weight: 3, EnableHTTPS: true, NodeCacheCapable: true,
			HTTPTimeout: 30 * time.Second, TLS: &ExtenderTLS{CAFile: "/ca.crt"},
			ManagedResources: []ManagedResource{{Name: "aliyun.com/gpu-mem", IgnoredByScheduler: true}},
		}},
	}, "/k.kubeconfig")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if got["apiVersion"] != "kubescheduler.config.k8s.io/v1" || got["kind"] != "KubeSchedulerConfiguration" {
		t.Errorf("type meta = %v %v", got["apiVersion"], got["kind"])
	}
	cc := got["clientConnection"].(map[string]any)
	if cc["kubeconfig"] != "/k.kubeconfig" || cc["qps"] != 500.0 || cc["burst"] != 1000.0 {
		t.Errorf("clientConnection = %v", cc)
	}
	ext := got["extenders"].([]any)[0].(map[string]any)
	want := map[string]any{
		"urlPrefix": "https://127.0.0.1:1234/gpushare-scheduler", "filterVerb": "filter", "bindVerb": "bind",
		"prioritizeVerb": "prioritize", "weight": 3.0, "enableHTTPS": true, "nodeCacheCapable": true,
		"ignorable": false, "httpTimeout": "30s",
	}
	for k, v := range want {
		if ext[k] != v {
			t.Errorf("extender %s = %v, want %v", k, ext[k], v)
		}
	}
	if tlsCfg := ext["tlsConfig"].(map[string]any); tlsCfg["caFile"] != "/ca.crt" {
		t.Errorf("tlsConfig = %v", tlsCfg)
	}
	mr := ext["managedResources"].([]any)[0].(map[string]any)
	if mr["name"] != "aliyun.com/gpu-mem" || mr["ignoredByScheduler"] != true {
		t.Errorf("managedResources = %v", mr)
	}
}

func TestSchedulerConfigJSONOmitsDefaults(t *testing.T) {
	data, err := schedulerConfigJSON(SchedulerConfig{}, "/k")
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	for _, absent := range []string{"extenders", "qps", "burst"} {
		if strings.Contains(s, absent) {
			t.Errorf("config without extenders or limits mentions %q:\n%s", absent, s)
		}
	}
}

// Every certificate chains to the cluster CA with the identity Kubernetes reads from it.
func TestPKIIssuesVerifiableCertificates(t *testing.T) {
	p, err := newPKI(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	caPEM, err := os.ReadFile(p.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(caPEM)

	client, err := p.issueClient("kubelet-n1", "system:node:n1", "system:nodes")
	if err != nil {
		t.Fatal(err)
	}
	cert := loadCert(t, client.Cert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client cert does not verify: %v", err)
	}
	if cert.Subject.CommonName != "system:node:n1" || len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != "system:nodes" {
		t.Errorf("client subject = %v", cert.Subject)
	}
	if _, err := tls.LoadX509KeyPair(client.Cert, client.Key); err != nil {
		t.Errorf("client key does not match: %v", err)
	}

	serving, err := p.issueServing("apiserver", "kubernetes.default")
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "localhost", "kubernetes.default", "::1"} {
		if _, err := loadCert(t, serving.Cert).Verify(x509.VerifyOptions{Roots: roots, DNSName: host}); err != nil {
			t.Errorf("serving cert for %s: %v", host, err)
		}
	}
	for _, f := range []string{"sa.key", "sa.pub", "ca.key"} {
		if _, err := os.Stat(filepath.Join(p.dir, f)); err != nil {
			t.Error(err)
		}
	}
}

func loadCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s holds no PEM", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// A process that exits while awaited fails the wait at once with its exit status, and its log
// keeps every run.
func TestProcessExitFailsWaitAndLogsRuns(t *testing.T) {
	dir := t.TempDir()
	p := newProcess("false", "/bin/sh", filepath.Join(dir, "p.log"), []string{"-c", "echo run; exit 3"})
	for range 2 {
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		err := waitUntil(t.Context(), time.Minute, "never ready", p, func(context.Context) (bool, error) { return false, nil })
		if err == nil || !strings.Contains(err.Error(), "exit status 3") {
			t.Fatalf("wait error = %v, want the exit status", err)
		}
	}
	tail := p.logTail(10)
	if strings.Count(tail, "\nrun") != 2 || strings.Count(tail, "==== false start") != 2 {
		t.Errorf("log tail = %q, want both runs", tail)
	}
}

// stop sends SIGTERM and, when the process ignores it, SIGKILL after the grace period.
func TestProcessStopKillsAfterGrace(t *testing.T) {
	p := newProcess("stubborn", "/bin/sh", filepath.Join(t.TempDir(), "p.log"),
		[]string{"-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done"})
	if err := p.start(); err != nil {
		t.Fatal(err)
	}
	if err := waitUntil(t.Context(), 10*time.Second, "trap set", p, func(context.Context) (bool, error) {
		return strings.Contains(p.logTail(1), "ready"), nil
	}); err != nil {
		t.Fatal(err)
	}
	p.stop(200 * time.Millisecond)
	if p.running() {
		t.Fatal("process survived stop")
	}
	p.stop(time.Second) // stopping a stopped process is a no-op
}
