// Command gpushare-scheduler is kube-scheduler with the GPUShare framework
// plugin compiled in (docs/scheduler-plugin.md): the extender's placement,
// hold-back rule, binding and preemption inside the scheduler, with no HTTP
// round trip per pod. Its flags and configuration are kube-scheduler's.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/gpushare/gpushare/cmd/gpushare-scheduler/gpushareplugin"
)

func main() {
	cmd := app.NewSchedulerCommand(app.WithPlugin(gpushareplugin.Name, gpushareplugin.New))
	os.Exit(cli.Run(cmd))
}
