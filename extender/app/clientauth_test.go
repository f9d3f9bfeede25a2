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

// authority is a test CA that issues server and client certificates.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newAuthority(t *testing.T, cn string) *authority {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &authority{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate named cn for usage, as a tls.Certificate and
// as PEM files' contents.
func (a *authority) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, dnsNames ...string) (tls.Certificate, []byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, DNSNames: dnsNames,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return pair, certPEM, keyPEM
}

// mtlsClient is an HTTPS client trusting ca that presents certs (none for nil).
func mtlsClient(ca *authority, certs ...tls.Certificate) *http.Client {
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs},
	}}
}

// TestMutualTLS: with a client CA, the probes answer anyone, every other
// path needs a certificate the CA signed, a certificate of another CA fails
// the handshake, and -tls-client-names keeps the verbs from a certificate
// that may only read.
func TestMutualTLS(t *testing.T) {
	serverCA, clientCA, otherCA := newAuthority(t, "server-ca"), newAuthority(t, "client-ca"), newAuthority(t, "other-ca")
	_, certPEM, keyPEM := serverCA.issue(t, "extender", x509.ExtKeyUsageServerAuth)
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, certPEM, keyPEM, time.Now())
	caFile := filepath.Join(dir, "client-ca.crt")
	if err := os.WriteFile(caFile, clientCA.pem, 0o600); err != nil {
		t.Fatal(err)
	}
	in := start(t, Config{
		Client: fake.NewClientset(gpuNode("n1", 32, 2)), TLSCertFile: certFile, TLSKeyFile: keyFile,
		TLSClientCAFile: caFile, TLSClientNames: []string{"kube-scheduler"},
	})
	in.url = strings.Replace(in.url, "http://", "https://", 1)
	scheduler, _, _ := clientCA.issue(t, "system:kube-scheduler", x509.ExtKeyUsageClientAuth, "kube-scheduler")
	reader, _, _ := clientCA.issue(t, "prometheus", x509.ExtKeyUsageClientAuth)
	stranger, _, _ := otherCA.issue(t, "kube-scheduler", x509.ExtKeyUsageClientAuth)

	in.client = mtlsClient(serverCA) // no certificate
	in.eventually("ready without a client certificate", in.ready)
	for _, path := range []string{"/healthz", "/version"} {
		if code, body := in.do("GET", path, nil); code != http.StatusOK {
			t.Errorf("GET %s without a certificate: %d %s, want 200 (a probe)", path, code, body)
		}
	}
	for _, req := range [][2]string{{"POST", "/gpushare-scheduler/filter"}, {"POST", "/gpushare-scheduler/bind"}, {"GET", "/gpushare-scheduler/inspect"}, {"GET", "/metrics"}} {
		code, body := in.do(req[0], req[1], filterArgs)
		if code != http.StatusUnauthorized || !strings.Contains(body, "client certificate") {
			t.Errorf("%s %s without a certificate: %d %s, want 401 naming the certificate", req[0], req[1], code, body)
		}
	}

	in.client = mtlsClient(serverCA, reader)
	if code, body := in.do("POST", "/gpushare-scheduler/filter", filterArgs); code != http.StatusForbidden || !strings.Contains(body, "prometheus") {
		t.Errorf("filter with the reader's certificate: %d %s, want 403 naming it", code, body)
	}
	for _, path := range []string{"/metrics", "/gpushare-scheduler/inspect"} {
		if code, body := in.do("GET", path, nil); code != http.StatusOK {
			t.Errorf("GET %s with the reader's certificate: %d %s, want 200", path, code, body)
		}
	}
	if got := in.metric(`gpushare_extender_client_refused_total{reason="name-not-allowed"}`); got != "1" {
		t.Errorf("name-not-allowed refusals counted %q, want 1", got)
	}
	if got := in.metric(`gpushare_extender_client_refused_total{reason="no-certificate"}`); got != "4" {
		t.Errorf("no-certificate refusals counted %q, want 4", got)
	}

	in.client = mtlsClient(serverCA, scheduler)
	if code, body := in.do("POST", "/gpushare-scheduler/filter", filterArgs); code != http.StatusOK || !strings.Contains(body, "n1") {
		t.Errorf("filter with the scheduler's certificate: %d %s, want 200 passing n1", code, body)
	}

	// Go's client offers a certificate only for the CAs the server names, so
	// a stranger's goes unsent and the request counts as without one...
	in.client = mtlsClient(serverCA, stranger)
	if code, _ := in.do("GET", "/metrics", nil); code != http.StatusUnauthorized {
		t.Errorf("GET /metrics with another CA's certificate: %d, want 401", code)
	}
	// ...and one pushed anyway fails the handshake.
	forced := mtlsClient(serverCA)
	forced.Transport.(*http.Transport).TLSClientConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &stranger, nil
	}
	req, err := http.NewRequestWithContext(context.Background(), "GET", in.url+"/healthz", nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := forced.Do(req); err == nil {
		resp.Body.Close()
		t.Error("a certificate of another CA, presented, was accepted")
	}
}

// TestClientCAReload: the client CA file is re-read like the serving pair:
// a new CA is picked up after the interval, a file that holds no certificate
// keeps the previous pool.
func TestClientCAReload(t *testing.T) {
	a, b := newAuthority(t, "ca-a"), newAuthority(t, "ca-b")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	base := time.Unix(1_700_000_000, 0)
	write := func(data []byte, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(caFile, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(caFile, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	write(a.pem, base)
	now := base
	r, err := newClientCAReloader(caFile, 5*time.Second, func() time.Time { return now }, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	_, certB, _ := b.issue(t, "client", x509.ExtKeyUsageClientAuth)
	leafB, err := x509.ParseCertificate(pemBytes(t, certB))
	if err != nil {
		t.Fatal(err)
	}
	trusts := func() bool {
		_, err := leafB.Verify(x509.VerifyOptions{Roots: r.current(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		return err == nil
	}
	if trusts() {
		t.Fatal("trusts CA b before it is in the file")
	}
	write(b.pem, base.Add(time.Hour))
	now = now.Add(6 * time.Second)
	if !trusts() {
		t.Fatal("CA b not trusted after the file changed")
	}
	write([]byte("not a certificate"), base.Add(2*time.Hour))
	now = now.Add(6 * time.Second)
	if !trusts() {
		t.Fatal("an unreadable CA file replaced the pool")
	}
	if _, err := newClientCAReloader(filepath.Join(t.TempDir(), "none.crt"), time.Second, time.Now, zaptest.NewLogger(t)); err == nil {
		t.Error("a missing CA file accepted at start")
	}
	write([]byte("not a certificate"), base)
	if _, err := newClientCAReloader(caFile, time.Second, time.Now, zaptest.NewLogger(t)); err == nil {
		t.Error("a CA file with no certificate accepted at start")
	}
}

func pemBytes(t *testing.T, data []byte) []byte {
	t.Helper()
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("no PEM block")
	}
	return block.Bytes
}
