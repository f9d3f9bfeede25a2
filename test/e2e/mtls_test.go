//go:build e2e

package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

// TestMutualTLSShipped runs the mutual-TLS path exactly as shipped: certificates from
// manifests/mtls/gen-certs.sh, its Secret applied and mounted, the extender with the mtls/
// overlay's arguments, and the real kube-scheduler with mtls/kube-scheduler-config.yaml. A GPU pod
// is filtered and bound through it; the same scheduler without its client certificate is refused
// (401) and binds nothing; a certificate that may only read gets /metrics and not the verbs.
func TestMutualTLSShipped(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dir, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	own, err := cluster.OwnBinaries(t.TempDir(), false)
	if err != nil {
		t.Fatal(err)
	}
	c := cluster.StartT(t, cluster.Config{NoScheduler: true})

	certs := t.TempDir()
	gen := exec.CommandContext(ctx, "bash", filepath.Join(dir, "mtls", "gen-certs.sh"), certs, "--client", "prometheus")
	if out, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("gen-certs.sh: %v\n%s", err, out)
	}
	mounted := mountSecret(t, c, filepath.Join(certs, "secret.yaml"))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	args := append(shippedExtenderArgs(t, dir, mounted, addr), "--kubeconfig="+c.AdminKubeconfig())
	if _, err := c.StartProgram("extender-mtls", filepath.Join(own, "gpushare-scheduler-extender"), args); err != nil {
		t.Fatal(err)
	}
	reader := certsClient(t, certs, "prometheus")
	pollUntil(t, waitLong, "the extender ready over HTTPS", func() bool {
		return get(reader, "https://"+addr+"/readyz") == http.StatusOK
	})

	if err := c.CreateNodes(ctx, []cluster.NodeSpec{{Name: "gpu-0", Resources: map[corev1.ResourceName]int64{
		gpushare.ResourceName: 64, gpushare.ResourceCount: 4,
	}}}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, manifests.MTLSSchedulerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	// The scheduler reads the files gen-certs.sh wrote, as copied to the control-plane node.
	extenders, err := manifests.Extenders(data, "https://"+addr+gpushare.ExtenderURLPrefix, func(f string) string {
		return filepath.Join(certs, filepath.Base(f))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{Extenders: extenders}); err != nil {
		t.Fatal(err)
	}
	createGPUPod(t, c, "mtls-0")
	p, err := c.WaitForPod(ctx, "default", "mtls-0", waitLong, "bound", cluster.PodBound)
	if err != nil {
		t.Fatal(err)
	}
	if a, ok, err := gpushare.DecodePodAssignment(p.Annotations); !ok || err != nil || a.PodUnits != 6 {
		t.Fatalf("pod bound to %s with annotations %v (%v); want our extender's assignment", p.Spec.NodeName, p.Annotations, err)
	}

	// The same scheduler without its client certificate.
	noCert := slices.Clone(extenders)
	tlsCopy := *noCert[0].TLS
	tlsCopy.CertFile, tlsCopy.KeyFile = "", ""
	noCert[0].TLS = &tlsCopy
	if err := c.StartScheduler(ctx, cluster.SchedulerConfig{Extenders: noCert}); err != nil {
		t.Fatal(err)
	}
	createGPUPod(t, c, "mtls-1")
	unscheduled, err := c.WaitForPod(ctx, "default", "mtls-1", waitLong, "refused by the extender", func(p *corev1.Pod) bool {
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && strings.Contains(cond.Message, "401") {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatal(err)
	}
	if unscheduled.Spec.NodeName != "" {
		t.Fatalf("pod bound to %s by a scheduler without a client certificate", unscheduled.Spec.NodeName)
	}
	t.Logf("without a client certificate: %s", podScheduledMessage(unscheduled))
	metrics := readBody(t, reader, "https://"+addr+"/metrics")
	if !strings.Contains(metrics, `gpushare_extender_client_refused_total{reason="no-certificate"}`) ||
		strings.Contains(metrics, `gpushare_extender_client_refused_total{reason="no-certificate"} 0`) {
		t.Errorf("no refusal counted:\n%s", grepLines(metrics, "client_refused"))
	}
	// The reader's certificate (CN prometheus) is not a scheduler's.
	resp, err := reader.Post("https://"+addr+gpushare.ExtenderURLPrefix+"/filter", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("filter with the reader's certificate: %d, want 403", resp.StatusCode)
	}
}

// mountSecret applies the Secret in file and writes its keys into a directory, as the kubelet
// mounts a Secret volume; it returns the directory.
func mountSecret(t *testing.T, c *cluster.Cluster, file string) string {
	t.Helper()
	objs, err := manifests.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	applier, err := manifests.NewApplier(c.RESTConfig(), "gpushare-e2e")
	if err != nil {
		t.Fatal(err)
	}
	if err := applier.ApplyAll(t.Context(), objs); err != nil {
		t.Fatal(err)
	}
	secret, err := c.Client().CoreV1().Secrets(objs[0].GetNamespace()).Get(t.Context(), objs[0].GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for k, v := range secret.Data {
		if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// shippedExtenderArgs returns the mtls/ overlay's extender arguments with its Secret mount moved
// to mounted and --listen set to addr.
func shippedExtenderArgs(t *testing.T, dir, mounted, addr string) []string {
	t.Helper()
	objs, err := manifests.Load(filepath.Join(dir, "mtls"))
	if err != nil {
		t.Fatal(err)
	}
	var args []string
	var mountPath string
	for _, o := range objs {
		if o.GetKind() != "Deployment" || o.GetName() != "gpushare-scheduler-extender" {
			continue
		}
		var d appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
			t.Fatal(err)
		}
		ctr := d.Spec.Template.Spec.Containers[0]
		args = ctr.Args
		for _, m := range ctr.VolumeMounts {
			mountPath = m.MountPath
		}
	}
	if len(args) == 0 || mountPath == "" {
		t.Fatal("mtls/ has no extender Deployment with a volume mount")
	}
	var out []string
	for _, a := range args {
		if strings.HasPrefix(a, "--listen=") {
			a = "--listen=" + addr
		}
		out = append(out, strings.ReplaceAll(a, mountPath, mounted))
	}
	return out
}

// certsClient is an HTTPS client trusting gen-certs.sh's CA and presenting its certificate name.
func certsClient(t *testing.T, certs, name string) *http.Client {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(certs, name+".crt"), filepath.Join(certs, name+".key"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}},
	}}
}

func get(client *http.Client, url string) int {
	resp, err := client.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func readBody(t *testing.T, client *http.Client, url string) string {
	t.Helper()
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
	}
	return string(body)
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func createGPUPod(t *testing.T, c *cluster.Cluster, name string) {
	t.Helper()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: units(6)}},
	}}
	if _, err := c.Client().CoreV1().Pods("default").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func podScheduledMessage(p *corev1.Pod) string {
	for _, cond := range p.Status.Conditions {
		if cond.Type == corev1.PodScheduled {
			return cond.Message
		}
	}
	return ""
}
