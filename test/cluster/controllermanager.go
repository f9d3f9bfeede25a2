package cluster

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// ControllerManagerControllers is the bed's --controllers for kube-controller-manager: every
// controller enabled by default, less the node lifecycle controller. The bed's nodes are Node
// objects without a kubelet (CreateNodes) and hollow kubelets that tests stop and kill on purpose:
// the node lifecycle controller would mark them unreachable after its grace period, taint them
// NoSchedule and NoExecute, and the taint eviction controller would then evict their pods. Without
// it, a Node stays as its kubelet (or the test) last wrote it, as it did before the bed ran a
// controller-manager. Everything else runs: Deployments, ReplicaSets, Jobs, DaemonSets,
// StatefulSets, garbage collection, namespace deletion, pod GC, ServiceAccounts and their tokens,
// the ResourceClaim controller, CSR signing and approval, root CA publishing.
const ControllerManagerControllers = "*,-node-lifecycle-controller"

// StartControllerManager starts kube-controller-manager (ControllerManagerControllers, no leader
// election, each controller with its own ServiceAccount's credentials) and waits until it serves
// /healthz. A running one is stopped first, so this is also how a test restarts it. extra flags
// come last (e.g. --kube-api-qps: each controller's client runs at the default 20 otherwise).
func (c *Cluster) StartControllerManager(ctx context.Context, extra ...string) error {
	c.StopControllerManager()
	kubeconfig := filepath.Join(c.dir, "controller-manager.kubeconfig")
	if _, err := os.Stat(kubeconfig); err != nil {
		if _, err := c.Kubeconfig("controller-manager", "system:kube-controller-manager"); err != nil {
			return err
		}
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	proc := newProcess("kube-controller-manager", filepath.Join(c.bin, "kube-controller-manager"),
		filepath.Join(c.dir, "kube-controller-manager.log"), append(controllerManagerArgs(kubeconfig, c.pki, ports[0]), extra...))
	if err := proc.start(); err != nil {
		return err
	}
	c.mu.Lock()
	c.controllers = proc
	c.mu.Unlock()
	// Like the scheduler's, its serving certificate is self-signed and /healthz is open to anyone.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	url := fmt.Sprintf("https://127.0.0.1:%d/healthz", ports[0])
	return waitUntil(ctx, c.timeout, "kube-controller-manager", proc, func(ctx context.Context) (bool, error) {
		return httpOK(ctx, insecure, url)
	})
}

func controllerManagerArgs(kubeconfig string, p *pki, port int) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig, "--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1", "--secure-port=" + strconv.Itoa(port),
		"--leader-elect=false",
		"--controllers=" + ControllerManagerControllers,
		// Each controller acts as system:serviceaccount:kube-system:<controller>, with the RBAC the
		// API server bootstraps for it, as in a kubeadm cluster: its tokens are TokenRequests,
		// signed with the key the API server verifies.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p.saKeyFile(), "--root-ca-file=" + p.CAFile(),
		// The cluster CA signs approved CertificateSigningRequests (kubelet client certificates).
		"--cluster-signing-cert-file=" + p.CAFile(), "--cluster-signing-key-file=" + p.caKeyFile(),
		"--v=2",
	}
}

// StopControllerManager stops kube-controller-manager if it runs.
func (c *Cluster) StopControllerManager() {
	c.mu.Lock()
	p := c.controllers
	c.mu.Unlock()
	if p != nil {
		p.stop(10 * time.Second)
	}
}
