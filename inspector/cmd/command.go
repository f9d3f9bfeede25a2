package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"syscall"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpushare/gpushare/inspector/collect"
	"github.com/gpushare/gpushare/inspector/render"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// Output formats accepted by -o.
const (
	OutputJSON = "json"
	OutputYAML = "yaml"
)

const (
	longHelp = `Show how GPU memory is shared in the cluster: per node and per GPU, what pods
were given (aliyun.com/gpu-mem), recomputed from the pod annotations written by
the gpushare scheduler extender and device plugin.

Without arguments, every node with allocatable aliyun.com/gpu-mem, or with a
ResourceSlice of our DRA driver (gpu-mem.gpushare.io), is shown; with NODE, only
that node. With -d, each node's pods, on nodes run by our device plugin each
container's GPU and the limits (environment) it was given, and on DRA nodes each
allocated ResourceClaim with the pods using it.`

	examples = `  # Summary of every GPU-sharing node
  kubectl inspect gpushare

  # Pods and containers on every node
  kubectl inspect gpushare -d

  # One node, another cluster
  kubectl inspect gpushare -d gpu-node-1 --context prod

  # Machine-readable, the schema of docs/inspector.md
  kubectl inspect gpushare -o json

  # Why a pod is pending (or why it is where it is), and where a new one would go
  kubectl inspect gpushare why infer-7c9f -n ml
  kubectl inspect gpushare fit -f infer.yaml --replicas 4`
)

// Streams are where the command writes: results to Out, warnings to ErrOut;
// In is what fit -f - reads (nil: the process's stdin).
type Streams struct {
	In     io.Reader
	Out    io.Writer
	ErrOut io.Writer
}

// NewClientFunc builds the API client from the REST config the flags select.
type NewClientFunc func(*rest.Config) (kubernetes.Interface, error)

// NewForConfig is the NewClientFunc of a real cluster.
func NewForConfig(cfg *rest.Config) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cfg)
}

// Options holds one invocation's flags and what Complete derived from them.
type Options struct {
	Streams
	// Details selects the per-pod view (-d).
	Details bool
	// Output is "", "json" or "yaml" (-o).
	Output string
	// Node limits the view to one node (the optional argument).
	Node string

	config    ConfigGetter
	newClient NewClientFunc
	client    kubernetes.Interface
	namespace string // the explicit -n, which filters the pods listed
}

// NewOptions returns options reading the connection from config and
// building clients with newClient.
func NewOptions(streams Streams, config ConfigGetter, newClient NewClientFunc) *Options {
	return &Options{Streams: streams, config: config, newClient: newClient}
}

// NewCommand returns the kubectl-inspect-gpushare command. kube provides the
// connection; a *KubeFlags is bound to the command's flags here, any other
// getter (genericclioptions.ConfigFlags) binds its own.
func NewCommand(streams Streams, kube ConfigGetter, newClient NewClientFunc) *cobra.Command {
	o := NewOptions(streams, kube, newClient)
	c := &cobra.Command{
		Use:     "kubectl-inspect-gpushare [NODE]",
		Short:   "Show GPU memory sharing per node, GPU, pod and container",
		Long:    longHelp,
		Example: examples,
		Args:    cobra.MaximumNArgs(1),
		Annotations: map[string]string{
			// --help reads as the command operators type.
			cobra.CommandDisplayNameAnnotation: "kubectl inspect gpushare",
		},
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(c *cobra.Command, args []string) error {
			if err := o.Complete(args); err != nil {
				return err
			}
			if err := o.Validate(); err != nil {
				return err
			}
			return o.Run(c.Context())
		},
	}
	c.SetOut(streams.Out)
	c.SetErr(streams.ErrOut)
	if streams.In != nil {
		c.SetIn(streams.In)
	}
	c.Flags().BoolVarP(&o.Details, "details", "d", false, "show the pods of each node and the limits given to each container")
	c.Flags().StringVarP(&o.Output, "output", "o", "", "output format: json or yaml (the documented stable schema); default is the table")
	if kf, ok := kube.(*KubeFlags); ok {
		// Persistent: why and fit connect with the same flags.
		kf.AddFlags(c.PersistentFlags())
	}
	// A default "completion" command would shadow a node of that name.
	c.CompletionOptions.DisableDefaultCmd = true
	c.AddCommand(newWhyCommand(streams, kube, newClient), newFitCommand(streams, kube, newClient), newUICommand(streams, kube, newClient))
	return c
}

// Execute runs the command with args and returns the process exit code:
// 0, or 1 after printing "error: ..." on ErrOut.
func Execute(ctx context.Context, args []string, streams Streams, kube ConfigGetter, newClient NewClientFunc) int {
	c := NewCommand(streams, kube, newClient)
	c.SetArgs(args)
	if err := c.ExecuteContext(ctx); err != nil {
		var code exitCode
		if errors.As(err, &code) {
			return int(code) // the answer is printed; only the status tells
		}
		fmt.Fprintln(streams.ErrOut, "error: "+err.Error())
		return 1
	}
	return 0
}

// exitCode is a command's answer that is not an error but must show in the
// exit status: why and fit exit 1 while the pod cannot be placed.
type exitCode int

func (c exitCode) Error() string { return "exit status " + strconv.Itoa(int(c)) }

// errNoKubeconfig is what a user without any configuration sees.
var errNoKubeconfig = errors.New("no kubeconfig found: set KUBECONFIG, pass --kubeconfig FILE, or create ~/.kube/config")

// Complete reads the argument and builds the client from the connection flags.
func (o *Options) Complete(args []string) error {
	if len(args) > 0 {
		o.Node = args[0]
	}
	client, ns, explicit, err := connect(o.config, o.newClient)
	if err != nil {
		return err
	}
	o.client = client
	if explicit {
		o.namespace = ns
	}
	return nil
}

// connect builds the API client the connection flags select and reads the
// namespace: -n when explicit, else the kubeconfig context's ("default"
// when it names none).
func connect(config ConfigGetter, newClient NewClientFunc) (kubernetes.Interface, string, bool, error) {
	cfg, err := config.ToRESTConfig()
	if err != nil {
		if clientcmd.IsEmptyConfig(err) {
			return nil, "", false, errNoKubeconfig
		}
		return nil, "", false, fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg = rest.CopyConfig(cfg)
	// Protobuf halves the bytes and the decode time of a 50,000-pod LIST.
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	client, err := newClient(cfg)
	if err != nil {
		return nil, "", false, fmt.Errorf("create API client: %w", err)
	}
	ns, explicit, err := config.ToRawKubeConfigLoader().Namespace()
	if err != nil || ns == "" {
		ns, explicit = metav1.NamespaceDefault, false
	}
	return client, ns, explicit, nil
}

// Validate checks the flag values.
func (o *Options) Validate() error {
	switch o.Output {
	case "", OutputJSON, OutputYAML:
	default:
		return fmt.Errorf("unknown output format %q: use -o json or -o yaml, or no -o for the table", o.Output)
	}
	if o.client == nil {
		return errors.New("no API client: Complete was not called")
	}
	return nil
}

// Run reads the cluster once, builds the report and renders it.
func (o *Options) Run(ctx context.Context) error {
	objects, err := o.read(ctx)
	if err != nil {
		return err
	}
	report := collect.BuildObjects(objects)
	if len(report.Nodes) == 0 {
		return errors.New("no GPU-sharing nodes found: no node has allocatable " + string(gpushare.ResourceName) +
			" or a ResourceSlice of " + gpushare.DRADriverName +
			"; check that the gpushare device plugin runs on the GPU nodes (they are labelled " +
			gpushare.LabelGPUShare + "=" + gpushare.LabelValueTrue + ") and that --context names the right cluster")
	}
	if o.namespace != "" {
		for i := range report.Nodes {
			n := &report.Nodes[i]
			// Totals keep every namespace: they describe the GPUs, not the filter.
			n.Pods = slices.DeleteFunc(n.Pods, func(p collect.Pod) bool { return p.Namespace != o.namespace })
			n.Claims = slices.DeleteFunc(n.Claims, func(c collect.Claim) bool { return c.Namespace != o.namespace })
		}
	}
	for _, s := range report.Skipped {
		fmt.Fprintln(o.ErrOut, "warning: skipped "+s.String())
	}
	switch {
	case o.Output == OutputJSON:
		return render.JSON(o.Out, report)
	case o.Output == OutputYAML:
		return render.YAML(o.Out, report)
	case o.Details:
		return render.Details(o.Out, report)
	default:
		return render.Summary(o.Out, report)
	}
}

// activePods keeps finished pods out server-side; collect filters again.
var activePods = fields.AndSelectors(
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
	fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
)

// read is the command's only API traffic: a LIST of nodes, one of our
// driver's ResourceSlices, one of ResourceClaims (only when there are such
// slices) and one of pods, each in pages of 500; for one node a GET of it
// and LISTs scoped to it (claims are namespaced, not node-scoped). When the
// DRA objects cannot be read, it warns once and goes on without them.
func (o *Options) read(ctx context.Context) (collect.Objects, error) {
	var objects collect.Objects
	podSelector := activePods
	if o.Node == "" {
		list, err := listNodes(ctx, o.client)
		if err != nil {
			return objects, apiError("list nodes", err)
		}
		objects.Nodes = list
	} else {
		node, err := o.getNode(ctx)
		if err != nil {
			return objects, err
		}
		objects.Nodes = []corev1.Node{*node}
		podSelector = fields.AndSelectors(podSelector, fields.OneTermEqualSelector("spec.nodeName", o.Node))
	}
	slices, claims, draErr := readDRA(ctx, o.client, o.Node)
	if o.Node != "" {
		if err := notSharing(&objects.Nodes[0], slices, draErr); err != nil {
			return objects, err
		}
	}
	if draErr != nil {
		fmt.Fprintln(o.ErrOut, "warning: DRA-mode nodes not shown: "+draErr.Error())
	}
	objects.Slices, objects.Claims = slices, claims
	pods, err := listPods(ctx, o.client, podSelector)
	if err != nil {
		return objects, apiError("list pods", err)
	}
	objects.Pods = pods
	return objects, nil
}

// getNode reads the node named on the command line.
func (o *Options) getNode(ctx context.Context) (*corev1.Node, error) {
	node, err := o.client.CoreV1().Nodes().Get(ctx, o.Node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("node %q not found: run kubectl inspect gpushare to list the GPU-sharing nodes", o.Node)
	}
	if err != nil {
		return nil, apiError("get node "+o.Node, err)
	}
	return node, nil
}

// notSharing says why node is not a GPU-sharing node of either mode; nil
// when it is one.
func notSharing(node *corev1.Node, slices []resourceapi.ResourceSlice, draErr error) error {
	if collect.IsSharingNode(node) || collect.IsDRANode(node.Name, slices) {
		return nil
	}
	err := fmt.Errorf("node %q is not a GPU-sharing node: it has no allocatable %s and no ResourceSlice of %s; check that the gpushare device plugin or its DRA driver runs there",
		node.Name, gpushare.ResourceName, gpushare.DRADriverName)
	if draErr != nil {
		err = fmt.Errorf("%w (ResourceSlices could not be read: %w)", err, draErr)
	}
	return err
}

// apiError adds what to do to the errors users can fix.
func apiError(what string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %w (the inspector needs get and list on nodes and list on pods in all namespaces)", what, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: %w (the credentials of the current context were refused; check --context and --kubeconfig)", what, err)
	}
	var dnsErr *net.DNSError
	if errors.Is(err, syscall.ECONNREFUSED) || errors.As(err, &dnsErr) {
		return fmt.Errorf("%s: %w (is the API server reachable? check --context and --server)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
