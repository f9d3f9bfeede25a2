// Package cluster starts and stops a real Kubernetes control plane on loopback for end-to-end
// tests, benchmarks and the local demo: etcd, kube-apiserver, kube-controller-manager (every
// default controller but node lifecycle), kube-scheduler (optionally with a scheduler extender in
// its configuration) and any number of hollow kubelets that run the real kubelet device manager,
// so device plugins register, get ListAndWatch'ed and Allocate'd as on a real node.
//
// The binaries come from the nested module in test/bed (see Binaries). Every component listens on
// a free port on 127.0.0.1 and keeps its state and log under one directory, so several clusters can
// run side by side. Children are started with a parent-death signal: nothing is left running after
// the process that started them exits, even when it is killed.
//
// Tests use StartT, which stops the cluster when the test ends and prints every component's log
// tail when it failed. Programs use Start and Stop.
package cluster
