package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

const (
	webhookBin = "gpushare-webhook"
	// draNamespace is the demo's namespace opted into DRA: the samples applied there, unchanged,
	// are translated by the webhook and run on the DRA nodes.
	draNamespace = "gpushare-dra"
	// draBackend is the DRA nodes' simulated machine.
	draBackend = "simulated:dgxh100"
)

// draPool is the demo's DRA side: nodes whose GPUs our driver publishes, and the webhook.
type draPool struct {
	c           *cluster.Cluster
	procs       *processes
	binDir, dir string // programs; manifests/dra
	nodes       []string
}

// applyRights applies manifests/dra's DeviceClass, RBAC and admission policy: the driver and the
// webhook run with exactly these rights.
func (d *draPool) applyRights(ctx context.Context, applier *manifests.Applier) ([]*unstructured.Unstructured, error) {
	objs, err := manifests.Load(d.dir)
	if err != nil {
		return nil, err
	}
	var rights []*unstructured.Unstructured
	for _, o := range objs {
		switch o.GetKind() {
		case "DeviceClass", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			rights = append(rights, o)
		}
	}
	return objs, applier.ApplyAll(ctx, rights)
}

// addNode starts a hollow kubelet labelled for DRA and our driver for it, with its DaemonSet
// pod's credentials, and waits for the node's ResourceSlice.
func (d *draPool) addNode(ctx context.Context, name string) error {
	k, err := d.c.AddKubelet(ctx, name, cluster.KubeletOptions{
		Labels: map[string]string{gpushare.LabelNamespaceDRA: gpushare.LabelValueDRA}, KubeAPILimits: true,
	})
	if err != nil {
		return err
	}
	kubeconfig, err := d.c.PodTokenKubeconfig(ctx, "kube-system", "gpushare-dra-driver", "gpushare-dra-driver-"+name, name)
	if err != nil {
		return err
	}
	p, err := d.procs.start(ctx, "DRA driver on "+name, filepath.Join(d.binDir, pluginBin), filepath.Join(d.c.Dir(), "gpushare-dra-driver-"+name+".log"),
		[]string{gpushare.EnvNodeName + "=" + name},
		"--mode=dra", "--gpu-backend="+draBackend, "--kubeconfig="+kubeconfig,
		"--dra-plugin-dir="+k.PluginDataDir(gpushare.DRADriverName), "--dra-registrar-dir="+k.PluginsRegistryDir(),
		"--cdi-spec-dir="+k.CDISpecDir())
	if err != nil {
		return err
	}
	devices := 0
	if err := waitFor(ctx, time.Minute, p, "node "+name+"'s ResourceSlice", func() bool {
		list, err := d.c.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + name})
		if err != nil || len(list.Items) == 0 {
			return false
		}
		devices = len(list.Items[0].Spec.Devices)
		return devices > 0
	}); err != nil {
		return err
	}
	d.nodes = append(d.nodes, name)
	fmt.Printf("DRA node %s ready: %s, %d GPUs published by %s\n", name, draBackend, devices, gpushare.DRADriverName)
	return nil
}

// startWebhook runs gpushare-webhook with its Deployment's credentials and registers manifests/dra's
// MutatingWebhookConfiguration with a loopback URL in place of the Service, then opts
// draNamespace in.
func (d *draPool) startWebhook(ctx context.Context, objs []*unstructured.Unstructured) error {
	cert, key, ca, err := d.c.ServingCert(webhookBin)
	if err != nil {
		return err
	}
	kubeconfig, err := d.c.PodTokenKubeconfig(ctx, "kube-system", webhookBin, webhookBin+"-0", d.nodes[0])
	if err != nil {
		return err
	}
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	p, err := d.procs.start(ctx, "webhook", filepath.Join(d.binDir, webhookBin), filepath.Join(d.c.Dir(), webhookBin+".log"), nil,
		"-listen="+addr, "-tls-cert-file="+cert, "-tls-key-file="+key, "-kubeconfig="+kubeconfig)
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(ca)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, time.Minute, p, "webhook /healthz", func() bool { return healthy(caPEM, "https://"+addr+"/healthz") }); err != nil {
		return err
	}
	cfg, err := webhookConfiguration(objs)
	if err != nil {
		return err
	}
	url := "https://" + addr + "/mutate-pods"
	cfg.Webhooks[0].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM}
	if _, err := d.c.Client().AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		return err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: draNamespace, Labels: map[string]string{gpushare.LabelNamespaceDRA: gpushare.LabelValueDRA}}}
	if _, err := d.c.Client().CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	fmt.Printf("webhook ready on https://%s; namespace %s opted in (label %s=%s)\n", addr, draNamespace, gpushare.LabelNamespaceDRA, gpushare.LabelValueDRA)
	return nil
}

// webhookConfiguration is the MutatingWebhookConfiguration of manifests/dra.
func webhookConfiguration(objs []*unstructured.Unstructured) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	for _, o := range objs {
		if o.GetKind() != "MutatingWebhookConfiguration" {
			continue
		}
		var cfg admissionregistrationv1.MutatingWebhookConfiguration
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &cfg); err != nil {
			return nil, err
		}
		if len(cfg.Webhooks) == 0 {
			return nil, errors.New("manifests/dra's MutatingWebhookConfiguration has no webhook")
		}
		return &cfg, nil
	}
	return nil, errors.New("manifests/dra ships no MutatingWebhookConfiguration")
}

// healthy tells whether url answers 200 over TLS checked against caPEM.
func healthy(caPEM []byte, url string) bool {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := client.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}
