package manifests

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// TestNetworkPolicyAdmitsTheSchedulers: the extender's NetworkPolicy selects the extender's pods,
// guards only its port, and admits the shipped second scheduler's pods and kubeadm's
// kube-scheduler, and not an ordinary pod of kube-system.
func TestNetworkPolicyAdmitsTheSchedulers(t *testing.T) {
	objs := loadT(t, ".")
	np := convert[networkingv1.NetworkPolicy](t, objs["NetworkPolicy kube-system/gpushare-scheduler-extender"])
	ext := convert[appsv1.Deployment](t, objs["Deployment kube-system/gpushare-scheduler-extender"])
	if !selects(np.Spec.PodSelector.MatchLabels, ext.Spec.Template.Labels) {
		t.Fatalf("policy selector %v does not select the extender's pods %v", np.Spec.PodSelector.MatchLabels, ext.Spec.Template.Labels)
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].Ports) != 1 || np.Spec.Ingress[0].Ports[0].Port.IntValue() != 12345 {
		t.Fatalf("policy ingress %+v, want one rule for port 12345", np.Spec.Ingress)
	}
	second := convert[appsv1.Deployment](t, loadT(t, SecondSchedulerDir)["Deployment kube-system/gpushare-scheduler"])
	kubeadm := map[string]string{"component": "kube-scheduler", "tier": "control-plane"}
	other := map[string]string{"app.kubernetes.io/name": "coredns"}
	admitted := func(podLabels map[string]string) bool {
		for _, peer := range np.Spec.Ingress[0].From {
			if peer.PodSelector != nil && peer.NamespaceSelector == nil && selects(peer.PodSelector.MatchLabels, podLabels) {
				return true
			}
		}
		return false
	}
	for what, l := range map[string]map[string]string{"the second scheduler": second.Spec.Template.Labels, "kubeadm's kube-scheduler": kubeadm} {
		if !admitted(l) {
			t.Errorf("%s (labels %v) is not admitted from kube-system", what, l)
		}
	}
	if admitted(other) {
		t.Errorf("a kube-system pod labelled %v is admitted", other)
	}
}

func selects(sel, podLabels map[string]string) bool {
	return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(podLabels))
}

// TestNodePortOverlay: manifests/nodeport is the install plus the seed's NodePort, nothing else.
func TestNodePortOverlay(t *testing.T) {
	base, overlay := loadT(t, "."), loadT(t, "nodeport")
	if len(base) != len(overlay) {
		t.Errorf("nodeport/ has %d objects, manifests/ %d", len(overlay), len(base))
	}
	svc := convert[corev1.Service](t, overlay["Service kube-system/gpushare-scheduler-extender"])
	if p := svc.Spec.Ports; svc.Spec.Type != corev1.ServiceTypeNodePort || len(p) != 1 || p[0].Port != 12345 || p[0].NodePort != 32766 {
		t.Errorf("nodeport/ extender Service %s %+v, want NodePort 32766 -> 12345", svc.Spec.Type, p)
	}
}

// TestMTLSOverlay: manifests/mtls serves HTTPS from the Secret gen-certs.sh writes, requires
// client certificates of its ca.crt, lets only gen-certs.sh's scheduler certificate call the
// verbs, probes over HTTPS; and its scheduler configuration presents that certificate.
func TestMTLSOverlay(t *testing.T) {
	objs := loadT(t, "mtls")
	d := convert[appsv1.Deployment](t, objs["Deployment kube-system/gpushare-scheduler-extender"])
	spec := d.Spec.Template.Spec
	c := spec.Containers[0]
	mount := ""
	for _, m := range c.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil && v.Secret.SecretName == "gpushare-scheduler-extender-tls" && m.ReadOnly {
				mount = m.MountPath
			}
		}
	}
	if mount == "" {
		t.Fatalf("extender mounts %+v volumes %+v: no read-only mount of the Secret gpushare-scheduler-extender-tls", c.VolumeMounts, spec.Volumes)
	}
	for _, want := range []string{
		"--tls-cert-file=" + mount + "/tls.crt", "--tls-private-key-file=" + mount + "/tls.key",
		"--tls-client-ca-file=" + mount + "/ca.crt", "--tls-client-names=gpushare-kube-scheduler", "--leader-elect",
	} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("mtls/ extender args %v lack %s", c.Args, want)
		}
	}
	for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS {
			t.Errorf("mtls/ %s probe %+v, want HTTPS", what, p)
		}
	}
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, MTLSSchedulerConfigFile))
	if err != nil {
		t.Fatal(err)
	}
	cfg := checkExtender(t, MTLSSchedulerConfigFile, data, "12345")
	e := cfg.Extenders[0]
	if !e.EnableHTTPS || !strings.HasPrefix(e.URLPrefix, "https://") || e.TLS == nil || e.TLS.CertFile == "" || e.TLS.KeyFile == "" || e.TLS.CAFile == "" {
		t.Errorf("mtls/ scheduler extender %+v, want HTTPS with a CA and a client certificate", e)
	}
	script, err := os.ReadFile(filepath.Join(dir, "mtls", "gen-certs.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{e.TLS.CertFile, e.TLS.KeyFile, e.TLS.CAFile} {
		if !strings.Contains(string(script), filepath.Base(f)) {
			t.Errorf("the scheduler reads %s, which gen-certs.sh does not write", filepath.Base(f))
		}
	}
}

// TestIsolationOverlays: isolation-mps/ and isolation-hami-core/ run the plugin in their tier with
// the host directories its default flags name mounted at the same paths; mps adds what the MPS
// daemon needs (the compute capability, privilege for compute modes, no rolling updates).
func TestIsolationOverlays(t *testing.T) {
	for dir, want := range map[string]struct {
		arg    string
		mounts []string
	}{
		"isolation-mps":       {"--isolation=mps", []string{"/run/gpushare/mps", "/dev/shm"}},
		"isolation-hami-core": {"--isolation=hami-core", []string{"/usr/local/vgpu", "/tmp/vgpulock", "/var/lib/gpushare/hami-cache"}},
	} {
		ds := convert[appsv1.DaemonSet](t, loadT(t, dir)["DaemonSet kube-system/gpushare-device-plugin"])
		spec := ds.Spec.Template.Spec
		c := spec.Containers[0]
		if !slices.Contains(c.Args, want.arg) {
			t.Errorf("%s: args %v lack %s", dir, c.Args, want.arg)
		}
		hostPaths := map[string]string{}
		for _, v := range spec.Volumes {
			if v.HostPath != nil {
				hostPaths[v.Name] = v.HostPath.Path
			}
		}
		for _, path := range want.mounts {
			i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == path })
			if i < 0 || (path != "/dev/shm" && hostPaths[c.VolumeMounts[i].Name] != path) {
				t.Errorf("%s: no host directory mounted at %s (mounts %+v)", dir, path, c.VolumeMounts)
			}
		}
		if dir != "isolation-mps" {
			continue
		}
		caps := ""
		for _, e := range c.Env {
			if e.Name == "NVIDIA_DRIVER_CAPABILITIES" {
				caps = e.Value
			}
		}
		if !strings.Contains(caps, "compute") || c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged ||
			ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
			t.Errorf("%s: capabilities %q, security %+v, update %s; want compute, privileged, OnDelete", dir, caps, c.SecurityContext, ds.Spec.UpdateStrategy.Type)
		}
	}
}
