package manager

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
	"github.com/gpushare/gpushare/plugin/podsource"
)

// allocator answers Allocate: it matches the call with allocate.Match on
// the pod store, waits a bounded time for a pod bound a moment ago to reach
// the store, records what it served in memory and on the pod.
type allocator struct {
	log       *zap.Logger
	node      string
	src       *podsource.Source
	rec       *recorder
	inventory func() *inventory.Inventory
	wait      time.Duration

	// mu serialises calls: each decision must see every earlier one in served.
	mu     sync.Mutex
	served allocate.Served
}

// Allocate implements server.Allocator.
func (a *allocator) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	start := time.Now()
	inv := a.inventory()
	units := make([]uint64, 0, len(req.GetContainerRequests()))
	for _, c := range req.GetContainerRequests() {
		for _, id := range c.GetDevicesIds() {
			if _, _, err := inv.ParseDevice(id); err != nil {
				return nil, status.Errorf(codes.InvalidArgument, "gpushare: %v", err)
			}
		}
		units = append(units, uint64(len(c.GetDevicesIds())))
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	deadline := time.Now().Add(a.wait)
	var decisions []allocate.Decision
	for {
		changed := a.src.Changed()
		pods := a.src.Pods()
		a.prune(pods)
		in := allocate.Input{Node: a.node, Inventory: inv, Pods: pods, Served: a.served}
		if n, ok := a.src.Node(); ok {
			in.DisableIsolation = gpushare.IsolationDisabled(n.Labels)
		}
		var err error
		decisions, err = allocate.Match(in, units)
		if err == nil {
			break
		}
		if !errors.Is(err, allocate.ErrNoMatch) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		// The kubelet may call before the pod's binding reaches our watch.
		remaining := time.Until(deadline)
		if remaining <= 0 {
			a.log.Warn("Allocate matched no pod", zap.Uint64s("units", units), zap.Error(err))
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
		t := time.NewTimer(remaining)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		t.Stop()
	}

	resp := &pluginapi.AllocateResponse{}
	for _, d := range decisions {
		a.served.Add(d.Pod.UID, d.Container.Name, d.Env)
		log := a.log.With(zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name), zap.String("container", d.Container.Name),
			zap.Int("gpu", d.Env.GPUIndex), zap.Uint64("units", d.Env.ContainerUnits))
		if len(d.Conflicts) > 0 {
			log.Warn("ambiguous Allocate: in-flight containers of this size have different GPUs or limits; "+
				"the scheduler extender's rule was not followed and this answer may be for another pod",
				zap.Strings("conflicts", d.Conflicts))
		}
		if retrying, err := a.rec.record(ctx, d); err != nil {
			// The environment is right whatever happens to the record, and
			// the in-memory record keeps this process from serving the
			// container twice; failing the pod would help nobody. The
			// recorder retries in the background where that can help.
			log.Warn("record the container's environment on the pod", zap.Bool("retrying", retrying), zap.Error(err))
		}
		log.Info("allocated")
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{Envs: d.Env.Map()})
	}
	a.log.Debug("Allocate answered", zap.Duration("took", time.Since(start)))
	return resp, nil
}

// prune forgets served containers whose pod left the store or whose pod's
// record already shows them, so memory does not grow with the node's history.
func (a *allocator) prune(pods []*corev1.Pod) {
	if len(a.served) == 0 {
		return
	}
	byUID := make(map[string]*corev1.Pod, len(pods))
	for _, p := range pods {
		byUID[string(p.UID)] = p
	}
	for uid, containers := range a.served {
		p, ok := byUID[string(uid)]
		if !ok {
			delete(a.served, uid)
			continue
		}
		raw, ok := p.Annotations[gpushare.AnnotationContainerEnv]
		if !ok {
			continue
		}
		rec, err := gpushare.DecodeContainerEnvs(raw)
		if err != nil {
			continue
		}
		for name := range containers {
			if _, ok := rec[name]; ok {
				delete(containers, name)
			}
		}
		if len(containers) == 0 {
			delete(a.served, uid)
		}
	}
}
