package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
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

	"go.uber.org/zap/zaptest"
	"k8s.io/client-go/kubernetes/fake"
)

// selfSigned returns a PEM certificate for 127.0.0.1 named cn, and its key.
func selfSigned(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// writePair writes the pair and stamps both files with mod, as a rotation
// would (explicit times: a filesystem's clock may not tick between writes).
func writePair(t *testing.T, dir string, cert, key []byte, mod time.Time) (string, string) {
	t.Helper()
	c, k := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	for path, data := range map[string][]byte{c: cert, k: key} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	return c, k
}

func servedCN(t *testing.T, r *fileReloader[*tls.Certificate]) string {
	t.Helper()
	c := r.current()
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Subject.CommonName
}

func TestCertReload(t *testing.T) {
	dir := t.TempDir()
	base := time.Unix(1_700_000_000, 0)
	certA, keyA := selfSigned(t, "a")
	certFile, keyFile := writePair(t, dir, certA, keyA, base)
	now := base
	r, err := newCertReloader(certFile, keyFile, 5*time.Second, func() time.Time { return now }, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	if cn := servedCN(t, r); cn != "a" {
		t.Fatalf("serves %q, want a", cn)
	}
	// Rotated: not looked at again before the interval, picked up after it.
	certB, keyB := selfSigned(t, "b")
	writePair(t, dir, certB, keyB, base.Add(time.Hour))
	now = now.Add(4 * time.Second)
	if cn := servedCN(t, r); cn != "a" {
		t.Fatalf("serves %q within the interval, want a (files looked at on every handshake?)", cn)
	}
	now = now.Add(2 * time.Second)
	if cn := servedCN(t, r); cn != "b" {
		t.Fatalf("serves %q after the rotation, want b", cn)
	}
	// Half-written (new certificate, old key): the previous pair stays.
	certC, keyC := selfSigned(t, "c")
	writePair(t, dir, certC, keyB, base.Add(2*time.Hour))
	now = now.Add(6 * time.Second)
	if cn := servedCN(t, r); cn != "b" {
		t.Fatalf("serves %q from a mismatched pair, want b", cn)
	}
	// The key follows: the new pair is served.
	writePair(t, dir, certC, keyC, base.Add(3*time.Hour))
	now = now.Add(6 * time.Second)
	if cn := servedCN(t, r); cn != "c" {
		t.Fatalf("serves %q once the pair is complete, want c", cn)
	}
	// Files gone (a broken mount): keep serving what was loaded.
	if err := os.Remove(certFile); err != nil {
		t.Fatal(err)
	}
	now = now.Add(6 * time.Second)
	if cn := servedCN(t, r); cn != "c" {
		t.Fatalf("serves %q with the files gone, want c", cn)
	}
	if _, err := newCertReloader(certFile, keyFile, time.Second, time.Now, zaptest.NewLogger(t)); err == nil {
		t.Error("a missing certificate file accepted at start")
	}
}

func TestServesHTTPS(t *testing.T) {
	certPEM, keyPEM := selfSigned(t, "extender")
	certFile, keyFile := writePair(t, t.TempDir(), certPEM, keyPEM, time.Now())
	in := start(t, Config{Client: fake.NewClientset(gpuNode("n1", 32, 2)), TLSCertFile: certFile, TLSKeyFile: keyFile})
	host := strings.TrimPrefix(in.url, "http://")
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	in.url = "https://" + host
	in.client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	in.eventually("ready over HTTPS", in.ready)

	// Plain HTTP to the HTTPS port gets no answer from the extender.
	resp, err := http.Get("http://" + host + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || strings.Contains(string(body), "ok") {
		t.Errorf("plain HTTP to the HTTPS port: %d %q, want Go's 400 for HTTP on an HTTPS port", resp.StatusCode, body)
	}
	// TLS 1.1 is refused.
	old := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}
	if conn, err := tls.Dial("tcp", host, old); err == nil {
		conn.Close()
		t.Error("a TLS 1.1 handshake succeeded")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := (&tls.Dialer{Config: &tls.Config{RootCAs: roots}}).DialContext(ctx, "tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	if v := conn.(*tls.Conn).ConnectionState().Version; v < tls.VersionTLS12 {
		t.Errorf("negotiated TLS version %x", v)
	}
	conn.Close()
}
