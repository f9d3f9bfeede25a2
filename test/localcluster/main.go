// Command localcluster starts the local test bed for a person to use: etcd, kube-apiserver,
// kube-scheduler and hollow GPU nodes (real kubelet device manager, fake containers) on loopback.
// It prints a KUBECONFIG to export and runs until Ctrl-C (or SIGTERM), then stops everything.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
)

func main() {
	nodes := flag.Int("nodes", 2, "hollow GPU nodes to start (label gpushare=true)")
	dir := flag.String("dir", "", "keep the cluster's state and logs here (default: a temporary directory removed on exit)")
	flag.Parse()
	if err := run(*nodes, *dir); err != nil {
		fmt.Fprintln(os.Stderr, "localcluster:", err)
		os.Exit(1)
	}
}

func run(nodes int, dir string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	fmt.Println("building the test bed (cached after the first run; about 6.5 minutes cold on 2 cores)...")
	bin, err := cluster.Binaries()
	if err != nil {
		return err
	}
	fmt.Printf("test bed ready in %s: %s\n", time.Since(start).Round(time.Millisecond), bin)
	start = time.Now()
	c, err := cluster.Start(ctx, cluster.Config{BinDir: bin, Dir: dir})
	if err != nil {
		return err
	}
	defer c.Stop()
	fmt.Printf("control plane ready in %s\n", time.Since(start).Round(time.Millisecond))
	for i := range nodes {
		name := fmt.Sprintf("gpu-node-%d", i)
		start = time.Now()
		if _, err := c.AddKubelet(ctx, name, cluster.KubeletOptions{Labels: map[string]string{gpushare.LabelGPUShare: gpushare.LabelValueTrue}}); err != nil {
			return err
		}
		fmt.Printf("hollow node %s ready in %s\n", name, time.Since(start).Round(time.Millisecond))
	}
	fmt.Printf(`
The cluster is up (state and logs in %s).
In another shell:

  export KUBECONFIG=%s
  kubectl get nodes

Device plugins register on <node root>/device-plugins/kubelet.sock under %s/kubelets/.
Press Ctrl-C here to stop everything.
`, c.Dir(), c.AdminKubeconfig(), c.Dir())
	<-ctx.Done()
	fmt.Println("\nstopping...")
	return nil
}
