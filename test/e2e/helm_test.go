//go:build e2e

package e2e

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/app"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/test/cluster"
	"github.com/gpushare/gpushare/test/localcluster/manifests"
)

// helmRendered is the Helm chart (manifests/helm/gpushare) rendered by Helm's SDK in the module
// test/helm, with scheduler.mode=secondScheduler and metrics.devicePlugin=true; that module's
// TestE2EFileUpToDate fails when the file and the chart differ. Rendering here would bring Helm's
// dependencies into the project's go.mod.
const helmRendered = "../helm/testdata/e2e.yaml"

// TestHelmChart installs what the Helm chart renders into the test bed, as TestManifests does with
// the kustomize files: every object is accepted by the API server (server-side apply), the
// extender and the device plugin run with only the chart's RBAC and admission policy, kube-scheduler
// runs as the chart's second scheduler (its ConfigMap, arguments and RBAC), and a pod of the
// sample Deployment's template goes through it to Running with its GPU allocated.
func TestHelmChart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dir, err := manifests.Dir()
	if err != nil {
		t.Fatal(err)
	}
	chartObjs, err := manifests.ReadFile(helmRendered)
	if err != nil {
		t.Fatal(err)
	}
	samples, err := manifests.Load(filepath.Join(dir, "samples"))
	if err != nil {
		t.Fatal(err)
	}
	bin, err := cluster.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	// No controller-manager: the test runs the chart's Deployments' and DaemonSet's programs itself.
	c := cluster.StartT(t, cluster.Config{BinDir: bin, NoScheduler: true, NoControllerManager: true})

	// 1. The chart's objects (and the samples) are accepted as they are.
	applier, err := manifests.NewApplier(c.RESTConfig(), "gpushare-e2e-helm")
	if err != nil {
		t.Fatal(err)
	}
	if err := applier.ApplyAll(ctx, append(chartObjs, samples...)); err != nil {
		t.Fatal(err)
	}
	t.Logf("applied %d objects rendered by the chart", len(chartObjs))
	var schedulerConfig []byte
	for _, o := range chartObjs {
		if o.GetKind() == "ConfigMap" && o.GetName() == manifests.SecondSchedulerConfigMap {
			data, _, _ := unstructured.NestedString(o.Object, "data", manifests.SecondSchedulerConfigKey)
			schedulerConfig = []byte(data)
		}
	}
	if schedulerConfig == nil {
		t.Fatalf("%s has no ConfigMap %s", helmRendered, manifests.SecondSchedulerConfigMap)
	}
	ds, err := c.Client().AppsV1().DaemonSets("kube-system").Get(ctx, "gpushare-device-plugin", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if args := ds.Spec.Template.Spec.Containers[0].Args; !slices.Contains(args, "--metrics-listen=:9400") {
		t.Errorf("the chart's DaemonSet (metrics.devicePlugin=true) runs the plugin with %q", args)
	}

	// 2. The extender with the chart's RBAC and leader election, as its Deployment runs it.
	extClient := identityClient(t, c, "sa-extender", saExtender)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	extCtx, stopExt := context.WithCancel(context.Background())
	extDone := make(chan error, 1)
	election := &app.LeaderElection{Namespace: "kube-system", Name: "gpushare-scheduler-extender", Identity: "e2e-helm-extender",
		LeaseDuration: 3 * time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 500 * time.Millisecond}
	go func() {
		extDone <- app.Run(extCtx, ln, app.Config{Client: extClient, Logger: zaptest.NewLogger(t).Named("extender"), Policy: allocator.BestFit, Version: "e2e", LeaderElection: election})
	}()
	t.Cleanup(func() {
		stopExt()
		select {
		case err := <-extDone:
			if err != nil {
				t.Errorf("extender: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("extender did not stop")
		}
	})
	extURL := "http://" + ln.Addr().String()
	pollUntil(t, waitLong, "extender ready (leading) with the chart's RBAC", func() bool {
		ok, _ := httpGetOK(http.DefaultClient, extURL+"/readyz")
		return ok
	})

	// 3. The device plugin with the chart's RBAC and admission policy, as its DaemonSet's pod.
	kubelet, _ := startShippedPlugin(ctx, t, c, nil)

	// 4. kube-scheduler as the chart's second scheduler, with its ServiceAccount's identity.
	deploy, err := c.Client().AppsV1().Deployments("kube-system").Get(ctx, manifests.SecondSchedulerName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := c.Kubeconfig("sa-gpushare-scheduler", saScheduler)
	if err != nil {
		t.Fatal(err)
	}
	schedLog := startSchedulerWithConfig(t, c, bin, manifests.SecondSchedulerName+"-helm", kubeconfig, schedulerConfig, extURL, deploy.Spec.Template.Spec.Containers[0].Args)

	// 5. A pod of the sample Deployment's template (no controller-manager runs here) through it.
	sample, err := c.Client().AppsV1().Deployments("default").Get(ctx, "gpushare-sample", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := podFromTemplate(sample, "gpushare-helm-sample-0")
	pod.Spec.SchedulerName = manifests.SecondSchedulerName
	if _, err := c.Client().CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p, err := c.WaitForPod(ctx, "default", pod.Name, waitLong, "running and marked assigned by the device plugin", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && p.Annotations[gpushare.AnnotationAssigned] == "true"
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != kubelet.Name() || p.Annotations[gpushare.AnnotationPodUnits] == "" {
		t.Errorf("pod %s: node %q, annotations %v; want bound to %s by the extender", p.Name, p.Spec.NodeName, p.Annotations, kubelet.Name())
	}
	waitEvent(t, c.Client(), "default", p.UID, gpushare.EventReasonScheduled)
	if lines := grepFile(t, schedLog, "forbidden"); len(lines) > 0 {
		t.Errorf("the chart's second scheduler was refused API calls with its RBAC:\n%v", lines)
	}
}
