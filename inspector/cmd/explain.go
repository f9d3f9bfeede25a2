package cmd

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/inspector/explain"
	"github.com/gpushare/gpushare/inspector/render"
)

// explainOptions are what why and fit share: the connection, -o and --policy.
type explainOptions struct {
	Streams
	Output string
	Policy allocator.Policy
	policy string // --policy, parsed into Policy by complete

	config    ConfigGetter
	newClient NewClientFunc
	client    kubernetes.Interface
	namespace string // -n, else the context's, else default
}

func (o *explainOptions) addFlags(c *cobra.Command) {
	c.Flags().StringVarP(&o.Output, "output", "o", "", "output format: json or yaml (the documented stable schema); default is text")
	c.Flags().StringVar(&o.policy, "policy", "bestfit", "the extender's -policy: bestfit, spread or firstfit")
}

// complete connects and checks -o.
func (o *explainOptions) complete() error {
	switch o.Output {
	case "", OutputJSON, OutputYAML:
	default:
		return fmt.Errorf("unknown output format %q: use -o json or -o yaml, or no -o for text", o.Output)
	}
	p, err := allocator.ParsePolicy(o.policy)
	if err != nil {
		return err
	}
	o.Policy = p
	client, ns, _, err := connect(o.config, o.newClient)
	if err != nil {
		return err
	}
	o.client, o.namespace = client, ns
	return nil
}

// state lists every node and every pod that may hold GPU memory: what the
// extender's informers hold, read once.
func (o *explainOptions) state(ctx context.Context) (explain.State, error) {
	nodes, err := listNodes(ctx, o.client)
	if err != nil {
		return explain.State{}, apiError("list nodes", err)
	}
	pods, err := listPods(ctx, o.client, activePods)
	if err != nil {
		return explain.State{}, apiError("list pods", err)
	}
	return explain.State{Nodes: nodes, Pods: pods}, nil
}

// print renders v with -o, or text with textFn, and warns on stderr about
// pods left out of the replay; placed false makes the exit status 1.
func (o *explainOptions) print(v any, text func(io.Writer) error, skipped []explain.Skip, placed bool) error {
	for _, s := range skipped {
		fmt.Fprintln(o.ErrOut, "warning: skipped pod "+s.Pod+": "+s.Reason)
	}
	var err error
	switch o.Output {
	case OutputJSON:
		err = render.Value(o.Out, v)
	case OutputYAML:
		err = render.ValueYAML(o.Out, v)
	default:
		err = text(o.Out)
	}
	if err != nil {
		return err
	}
	if !placed {
		return exitCode(1)
	}
	return nil
}

const whyLong = `Explain why a pod is not placed: replays the gpushare extender's own placement on
the cluster as the API server shows it now and prints, per node, why the pod does
not fit there (fragmentation, an in-flight pod it waits behind, unhealthy or MIG
GPUs, an isolation tier or topology not offered, not a gpushare node, the
scheduler's own predicates), a summary and what would help. For a bound pod: where
it is, on which GPUs, and why there. Exit status 1 while the pod fits no node.`

func newWhyCommand(streams Streams, kube ConfigGetter, newClient NewClientFunc) *cobra.Command {
	o := &explainOptions{Streams: streams, config: kube, newClient: newClient}
	c := &cobra.Command{
		Use:   "why POD",
		Short: "Explain why a pod is pending, or why it is where it is",
		Long:  whyLong,
		Example: `  kubectl inspect gpushare why infer-7c9f -n ml
  kubectl inspect gpushare why infer-7c9f -n ml -o json`,
		Args:          cobra.ExactArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.complete(); err != nil {
				return err
			}
			return o.runWhy(c.Context(), args[0])
		},
	}
	o.addFlags(c)
	return c
}

func (o *explainOptions) runWhy(ctx context.Context, name string) error {
	pod, err := o.client.CoreV1().Pods(o.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("pod %q not found in namespace %q (use -n NAMESPACE)", name, o.namespace)
	}
	if err != nil {
		return apiError("get pod "+o.namespace+"/"+name, err)
	}
	st, err := o.state(ctx)
	if err != nil {
		return err
	}
	w, err := explain.ExplainWhy(st, pod, o.Policy)
	if err != nil {
		return err
	}
	return o.print(w, func(out io.Writer) error { return render.Why(out, w) }, w.Skipped, w.Bound != nil || w.Fitting > 0)
}

const fitLong = `Say where a pod would land and on which GPUs, without creating anything: the
gpushare extender's placement replayed on the cluster as the API server shows it
now. FILE (or - for stdin) holds one Pod, or a Deployment, StatefulSet, ReplicaSet,
Job or CronJob whose pod template is used. With --replicas N, copies are placed
one after another. Exit status 1 when not every copy fits.`

func newFitCommand(streams Streams, kube ConfigGetter, newClient NewClientFunc) *cobra.Command {
	o := &explainOptions{Streams: streams, config: kube, newClient: newClient}
	var file string
	var replicas int
	c := &cobra.Command{
		Use:   "fit -f FILE",
		Short: "Say where a pod would land, and how many copies fit",
		Long:  fitLong,
		Example: `  kubectl inspect gpushare fit -f infer.yaml
  kubectl inspect gpushare fit -f deploy.yaml --replicas 8
  helm template . | kubectl inspect gpushare fit -f - -o json`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(c *cobra.Command, _ []string) error {
			if err := o.complete(); err != nil {
				return err
			}
			return o.runFit(c.Context(), c.InOrStdin(), file, replicas)
		},
	}
	o.addFlags(c)
	c.Flags().StringVarP(&file, "filename", "f", "", "the manifest: a file, or - for stdin (required)")
	c.Flags().IntVar(&replicas, "replicas", 1, "how many copies to place, one after another")
	_ = c.MarkFlagRequired("filename") // the flag exists: cannot fail
	return c
}

func (o *explainOptions) runFit(ctx context.Context, stdin io.Reader, file string, replicas int) error {
	data, err := readManifest(stdin, file)
	if err != nil {
		return err
	}
	pod, err := explain.PodFromManifest(data, o.namespace, file)
	if err != nil {
		return err
	}
	st, err := o.state(ctx)
	if err != nil {
		return err
	}
	f, err := explain.ExplainFit(st, pod, o.Policy, replicas)
	if err != nil {
		return err
	}
	return o.print(f, func(out io.Writer) error { return render.Fit(out, f) }, f.Skipped, f.Placed == f.Replicas)
}

// readManifest reads FILE, or stdin for "-", at most a little more than
// PodFromManifest accepts so that it can say the input is too large.
func readManifest(stdin io.Reader, file string) ([]byte, error) {
	var r io.Reader = stdin
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("read manifest: %w", err)
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, 4<<20+1))
	if err != nil {
		return nil, fmt.Errorf("read manifest %s: %w", file, err)
	}
	return data, nil
}
