package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// PodTokenLifetime is how long PodToken's tokens are valid: longer than any test or demo session,
// since nothing here refreshes them as a kubelet refreshes a pod's projected token.
const PodTokenLifetime = 30 * 24 * time.Hour

// HolderImage is the image of the pods PodToken creates. The fake runtime runs any image until the
// container is stopped (only names with "exit-0" finish), so on a node with a kubelet the pod
// simply runs, like the DaemonSet pod it stands for; it requests nothing, so it takes no GPU.
const HolderImage = "registry.k8s.io/pause:3.10"

// PodToken returns a token of the ServiceAccount namespace/sa bound to the pod namespace/pod on
// node: the credential the kubelet gives a DaemonSet's pod, whose user carries the node's name in
// the extra authentication.kubernetes.io/node-name (ServiceAccountTokenPodNodeInfo). The bed has
// no controller-manager, so no DaemonSet makes that pod: PodToken creates it unless it exists,
// and refuses an existing one of another ServiceAccount or node. The Node must exist for the
// token to carry it; the token is valid while the pod exists, for PodTokenLifetime.
func (c *Cluster) PodToken(ctx context.Context, namespace, sa, pod, node string) (string, error) {
	p, err := c.ensureHolderPod(ctx, namespace, sa, pod, node)
	if err != nil {
		return "", err
	}
	lifetime := int64(PodTokenLifetime / time.Second)
	tr, err := c.client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			ExpirationSeconds: &lifetime,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request a token of %s/%s bound to pod %s: %w", namespace, sa, pod, err)
	}
	return tr.Status.Token, nil
}

// PodTokenKubeconfig writes a kubeconfig that authenticates with PodToken's token and returns its
// path, named after the pod: a program run with it is the ServiceAccount on node, as in its pod.
func (c *Cluster) PodTokenKubeconfig(ctx context.Context, namespace, sa, pod, node string) (string, error) {
	token, err := c.PodToken(ctx, namespace, sa, pod, node)
	if err != nil {
		return "", err
	}
	return c.TokenKubeconfig(namespace+"-"+pod, token)
}

// TokenKubeconfig writes a kubeconfig that authenticates with a bearer token and returns its
// path. name must be unique within the cluster.
func (c *Cluster) TokenKubeconfig(name, token string) (string, error) {
	return c.writeKubeconfig(name, &clientcmdapi.AuthInfo{Token: token})
}

// writeKubeconfig writes a kubeconfig for the API server with the given credentials (none when
// auth is empty) to <dir>/<name>.kubeconfig.
func (c *Cluster) writeKubeconfig(name string, auth *clientcmdapi.AuthInfo) (string, error) {
	path := filepath.Join(c.dir, name+".kubeconfig")
	cfg := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"bed": {Server: c.APIServerURL(), CertificateAuthority: c.pki.CAFile()}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{name: auth},
		Contexts:       map[string]*clientcmdapi.Context{"bed": {Cluster: "bed", AuthInfo: name}},
		CurrentContext: "bed",
	}
	if err := clientcmd.WriteToFile(cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return path, nil
}

// ensureHolderPod returns the pod namespace/name, created bound to node and running as sa when it
// does not exist yet.
func (c *Cluster) ensureHolderPod(ctx context.Context, namespace, sa, name, node string) (*corev1.Pod, error) {
	pods := c.client.CoreV1().Pods(namespace)
	p, err := pods.Create(ctx, holderPod(namespace, sa, name, node), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		p, err = pods.Get(ctx, name, metav1.GetOptions{})
		if err == nil && (p.Spec.ServiceAccountName != sa || p.Spec.NodeName != node) {
			return nil, fmt.Errorf("pod %s/%s exists with ServiceAccount %q on node %q, want %q on %q",
				namespace, name, p.Spec.ServiceAccountName, p.Spec.NodeName, sa, node)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("token holder pod %s/%s: %w", namespace, name, err)
	}
	return p, nil
}

// holderPod stands for a DaemonSet's pod: bound to node, running as sa, tolerating every taint as
// node agents do. It mounts no token: its token is requested for it (PodToken).
func holderPod(namespace, sa, name, node string) *corev1.Pod {
	automount := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{"gpushare-bed/token-holder": sa}},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			ServiceAccountName:           sa,
			AutomountServiceAccountToken: &automount,
			Tolerations:                  []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:                   []corev1.Container{{Name: "holder", Image: HolderImage}},
		},
	}
}

// StartTokenFaultProxy starts a fault proxy (StartFaultProxy) that has no identity of its own: it
// passes each client's bearer token on to the API server, so programs with tokens of their own
// (PodTokenKubeconfig) share one proxy and its rules while each keeps its identity, node claim
// included. A program reaches it through a kubeconfig from Through. The caller closes it.
func (c *Cluster) StartTokenFaultProxy(name string) (*FaultProxy, error) {
	upstream, err := c.writeKubeconfig(name+"-upstream", &clientcmdapi.AuthInfo{})
	if err != nil {
		return nil, err
	}
	return c.startNamedFaultProxy(name, upstream)
}

// Through writes a copy of kubeconfig whose server is the proxy, beside it with the suffix
// "-via-proxy", and returns its path. Its credentials pass through only a proxy that has none of
// its own (StartTokenFaultProxy); one from StartFaultProxy authenticates with its certificate,
// which the API server prefers.
func (p *FaultProxy) Through(kubeconfig string) (string, error) {
	to := kubeconfig[:len(kubeconfig)-len(filepath.Ext(kubeconfig))] + "-via-proxy" + filepath.Ext(kubeconfig)
	if err := writeProxiedKubeconfig(kubeconfig, p.url, to); err != nil {
		return "", err
	}
	return to, nil
}
