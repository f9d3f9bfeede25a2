// Package kubeconfig builds the API client configuration the programs share.
package kubeconfig

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Load reads the kubeconfig file at path, or the in-cluster configuration
// when path is empty, and names the client userAgent. It asks for protobuf,
// as kube-scheduler and the kubelet do: the extender watches every pod in
// the cluster, and protobuf events cost the API server and the extender a
// fraction of JSON's encoding and decoding, and share the API server's
// encoding of each event with the scheduler's watch.
func Load(path, userAgent string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if path == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, fmt.Errorf("API client configuration: %w", err)
	}
	cfg.UserAgent = userAgent
	PreferProtobuf(cfg)
	return cfg, nil
}

// PreferProtobuf makes cfg's client send and accept protobuf for built-in
// types, falling back to JSON for any the server cannot encode so.
func PreferProtobuf(cfg *rest.Config) {
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
}
