package cmd

import (
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ConfigGetter is what the command needs from the connection flags; both
// KubeFlags and cli-runtime's genericclioptions.ConfigFlags provide it.
type ConfigGetter interface {
	ToRESTConfig() (*rest.Config, error)
	ToRawKubeConfigLoader() clientcmd.ClientConfig
}

// KubeFlags are kubectl's connection flags (--kubeconfig, --context,
// --cluster, --user, -n/--namespace, --server, --token, --request-timeout,
// ...), bound through clientcmd exactly as kubectl's own ConfigFlags bind
// them, with the same names, shorthands and KUBECONFIG handling.
type KubeFlags struct {
	kubeconfig string
	overrides  clientcmd.ConfigOverrides
}

// NewKubeFlags returns unbound flags; call AddFlags.
func NewKubeFlags() *KubeFlags { return &KubeFlags{} }

// AddFlags binds the flags to fs.
func (f *KubeFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.kubeconfig, clientcmd.RecommendedConfigPathFlag, "", "Path to the kubeconfig file to use for CLI requests.")
	clientcmd.BindOverrideFlags(&f.overrides, fs, clientcmd.RecommendedConfigOverrideFlags(""))
}

// ToRawKubeConfigLoader merges --kubeconfig, $KUBECONFIG and ~/.kube/config
// with the override flags; in a pod without any of them it falls back to the
// in-cluster config, as kubectl does.
func (f *KubeFlags) ToRawKubeConfigLoader() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = f.kubeconfig
	overrides := f.overrides
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &overrides)
}

// ToRESTConfig returns the client configuration the flags select.
func (f *KubeFlags) ToRESTConfig() (*rest.Config, error) {
	return f.ToRawKubeConfigLoader().ClientConfig()
}
