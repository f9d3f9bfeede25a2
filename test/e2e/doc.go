// Package e2e holds the end-to-end tests: real etcd, kube-apiserver, kube-scheduler and hollow
// kubelets running the real kubelet device manager (package cluster), with our programs in the
// loop. They are built only with the e2e tag: `make e2e`.
package e2e
