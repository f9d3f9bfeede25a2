// Package cmd is the cobra glue of kubectl-inspect-gpushare in the kubectl
// plugin shape: Options with Complete (flags and kubeconfig → client),
// Validate (flag values) and Run (one read of the API → collect → render).
// The standard kubectl connection flags (--kubeconfig, --context, -n, ...)
// come from client-go's clientcmd, bound as kubectl binds them.
//
// It holds no globals: streams, the connection flags and the client
// constructor are passed in, so tests run the real command against a fake
// clientset or a real API server.
package cmd
