//go:build e2e

package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

// TestExtenderHTTPS: the extender binary serving HTTPS (-tls-cert-file, -tls-private-key-file)
// with a certificate of the cluster CA; the real kube-scheduler, configured with enableHTTPS and
// tlsConfig.caFile, filters and binds a GPU pod through it. A plain-HTTP client to the port gets
// no extender answer, and a rotated certificate is served without a restart.
func TestExtenderHTTPS(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	own, err := cluster.OwnBinaries(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})
	issuedCert, issuedKey, caFile, err := c.ServingCert("extender-tls")
	if err != nil {
		t.Fatal(err)
	}
	// The served files live where the test can replace them, as a Secret volume's do.
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	install := func(cert, key string) {
		t.Helper()
		for src, dst := range map[string]string{cert: certFile, key: keyFile} {
			data, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			tmp := dst + ".new"
			if err := os.WriteFile(tmp, data, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(tmp, dst); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(issuedCert, issuedKey)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if _, err := c.StartProgram("extender-https", filepath.Join(own, "gpushare-scheduler-extender"), []string{
		"-kubeconfig=" + c.AdminKubeconfig(), "-listen=" + addr,
		"-tls-cert-file=" + certFile, "-tls-private-key-file=" + keyFile,
	}); err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		t.Fatal("no CA certificate in " + caFile)
	}
	// A new connection each time, so each probe sees the certificate served now.
	https := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: true,
	}}
	pollUntil(t, waitLong, "extender ready over HTTPS", func() bool {
		ok, _ := httpGetOK(https, "https://"+addr+"/readyz")
		return ok
	})

	// Plain HTTP to the HTTPS port: Go's TLS server answers 400 itself, the extender never sees it.
	for _, req := range []struct{ method, path string }{{"GET", "/readyz"}, {"POST", gpushare.ExtenderURLPrefix + "/filter"}} {
		r, err := http.NewRequestWithContext(ctx, req.method, "http://"+addr+req.path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Logf("plain HTTP %s %s: %v", req.method, req.path, err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "HTTPS") {
			t.Errorf("plain HTTP %s %s: %d %q, want refused (400, HTTP request to an HTTPS server)", req.method, req.path, resp.StatusCode, body)
		}
	}

	if err := c.CreateNodes(ctx, []cluster.NodeSpec{{Name: "gpu-0", Resources: map[corev1.ResourceName]int64{
		gpushare.ResourceName: 64, gpushare.ResourceCount: 4,
	}}}); err != nil {
		t.Fatal(err)
	}
	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{Extenders: []cluster.Extender{{
		URLPrefix: "https://" + addr + gpushare.ExtenderURLPrefix, FilterVerb: "filter", BindVerb: "bind",
		EnableHTTPS: true, TLS: &cluster.ExtenderTLS{CAFile: caFile}, NodeCacheCapable: true,
		ManagedResources: []cluster.ManagedResource{{Name: string(gpushare.ResourceName)}},
	}}}); err != nil {
		t.Fatal(err)
	}
	scheduleThroughExtender := func(name string) {
		t.Helper()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: units(6)}},
		}}
		if _, err := c.Client().CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		p, err := c.WaitForPod(ctx, "default", name, waitLong, "bound", cluster.PodBound)
		if err != nil {
			t.Fatal(err)
		}
		// Only our bind writes the assignment: filter and bind went through HTTPS.
		if a, ok, err := gpushare.DecodePodAssignment(p.Annotations); !ok || err != nil || a.PodUnits != 6 {
			t.Errorf("pod %s bound to %s with annotations %v (%v); want our extender's assignment", name, p.Spec.NodeName, p.Annotations, err)
		}
	}
	scheduleThroughExtender("https-0")

	// Rotation: a new certificate replaces the files and is served without a restart.
	rotatedCert, rotatedKey, _, err := c.ServingCert("extender-tls-rotated")
	if err != nil {
		t.Fatal(err)
	}
	want := serial(t, rotatedCert)
	rotated := time.Now()
	install(rotatedCert, rotatedKey)
	pollUntil(t, 30*time.Second, "the rotated certificate served", func() bool {
		conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots})
		if err != nil {
			return false
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Cmp(want) == 0
	})
	t.Logf("rotated certificate served %v after the files changed", time.Since(rotated).Round(time.Millisecond))
	scheduleThroughExtender("https-1")
}

func serial(t *testing.T, certFile string) *big.Int {
	t.Helper()
	data, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("no PEM in " + certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert.SerialNumber
}
