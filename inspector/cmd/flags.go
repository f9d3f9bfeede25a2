package cmd

import (
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ConfigGetter is what the command needs from the connection flags;
// genericclioptions.ConfigFlags provides it, tests pass a fixed config.
type ConfigGetter interface {
	ToRESTConfig() (*rest.Config, error)
	ToRawKubeConfigLoader() clientcmd.ClientConfig
}

// flagBinder is a ConfigGetter with flags of its own to bind to the command.
type flagBinder interface {
	AddFlags(fs *pflag.FlagSet)
}

// NewKubeFlags returns kubectl's own connection flags (--kubeconfig,
// --context, --cluster, --user, -n/--namespace, --server, --token,
// --request-timeout, ...) with kubectl's KUBECONFIG handling.
func NewKubeFlags() *genericclioptions.ConfigFlags {
	return genericclioptions.NewConfigFlags(true)
}
