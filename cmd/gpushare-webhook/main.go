// Command gpushare-webhook is the DRA front door: a mutating admission
// webhook that turns pods asking for aliyun.com/gpu-mem, in namespaces
// labelled gpushare.io/dra=true, into pods holding a ResourceClaim of the
// DRA driver gpu-mem.gpushare.io, and keeps the claim templates they name
// (docs/dra.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/cmd/internal/kubeconfig"
	"github.com/gpushare/gpushare/cmd/internal/logging"
	"github.com/gpushare/gpushare/extender/app"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/webhook/admission"
	"github.com/gpushare/gpushare/webhook/templates"
)

// MutatePath is where the API server posts pod reviews.
const MutatePath = "/mutate-pods"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr, nil); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "gpushare-webhook:", err)
		}
		os.Exit(1)
	}
}

type options struct {
	listen, certFile, keyFile, kubeconfig string
	unit                                  gpushare.Unit
	grace, sweep                          time.Duration
	logLevel                              zapcore.Level
}

func parse(args []string, stderr io.Writer) (options, error) {
	o := options{unit: gpushare.GiB, logLevel: zapcore.InfoLevel}
	fs := flag.NewFlagSet("gpushare-webhook", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.listen, "listen", ":8443", "HTTPS address the API server calls")
	fs.StringVar(&o.certFile, "tls-cert-file", "", "serving certificate (PEM), reloaded when it changes; required: the API server calls webhooks over HTTPS only")
	fs.StringVar(&o.keyFile, "tls-key-file", "", "its private key (PEM)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster")
	fs.TextVar(&o.unit, "memory-unit", gpushare.GiB, "what one aliyun.com/gpu-mem unit is, as the device plugins' -memory-unit (GiB, MiB, <n>MiB)")
	fs.DurationVar(&o.grace, "template-grace", 10*time.Minute, "delete a claim template of ours once no unfinished pod has named it for this long")
	fs.DurationVar(&o.sweep, "sweep-interval", time.Minute, "how often templates are swept (made again when a pod names a missing one, deleted when unused)")
	fs.TextVar(&o.logLevel, "log-level", zapcore.InfoLevel, "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.certFile == "" || o.keyFile == "":
		return o, errors.New("-tls-cert-file and -tls-key-file are required")
	case o.grace <= 0 || o.sweep <= 0:
		return o, errors.New("-template-grace and -sweep-interval must be positive")
	}
	return o, nil
}

// run serves until ctx ends; ready, when set, gets the listener's address.
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- string) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	log, err := logging.New(o.logLevel)
	if err != nil {
		return err
	}
	defer func() { _ = log.Sync() }()
	cfg, err := kubeconfig.Load(o.kubeconfig, "gpushare-webhook")
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	view, err := startView(ctx, client)
	if err != nil {
		return err
	}
	keeper := templates.New(client, view, o.grace, time.Now, log.Named("templates"))
	go keeper.Run(ctx, o.sweep)
	tlsConfig, err := app.ServingTLS(o.certFile, o.keyFile, log.Named("tls"))
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle(MutatePath, &admission.Handler{Unit: o.unit, Templates: keeper, Log: log.Named("admission")})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := &http.Server{Handler: mux, TLSConfig: tlsConfig, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: zap.NewStdLog(log.Named("http"))}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(ln, "", "") }()
	log.Info("serving", zap.String("address", ln.Addr().String()), zap.Stringer("memoryUnit", o.unit))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(shutdown)
	}
}

// informerView reads templates and unfinished pods from informers' stores.
type informerView struct {
	templates, pods cache.Store
}

func (v informerView) Templates() []*resourceapi.ResourceClaimTemplate {
	return listOf[*resourceapi.ResourceClaimTemplate](v.templates)
}

func (v informerView) Pods() []*corev1.Pod { return listOf[*corev1.Pod](v.pods) }

func listOf[T any](s cache.Store) []T {
	items := s.List()
	out := make([]T, 0, len(items))
	for _, it := range items {
		if t, ok := it.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// startView starts the two informers and waits for their first lists. Pods
// are listed without the finished ones and kept with only what a sweep
// reads, so a large cluster costs little memory.
func startView(ctx context.Context, client kubernetes.Interface) (informerView, error) {
	tmpl := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.LabelSelector = templates.Selector()
	})).Resource().V1().ResourceClaimTemplates().Informer()
	pods := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = "status.phase!=" + string(corev1.PodSucceeded) + ",status.phase!=" + string(corev1.PodFailed)
	})).Core().V1().Pods().Informer()
	if err := pods.SetTransform(slimPod); err != nil {
		return informerView{}, err
	}
	go tmpl.Run(ctx.Done())
	go pods.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), tmpl.HasSynced, pods.HasSynced) {
		return informerView{}, errors.New("the informers did not sync")
	}
	return informerView{templates: tmpl.GetStore(), pods: pods.GetStore()}, nil
}

// slimPod keeps a pod's identity and claims.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion},
		Spec: corev1.PodSpec{ResourceClaims: p.Spec.ResourceClaims}}, nil
}
