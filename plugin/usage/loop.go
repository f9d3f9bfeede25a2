package usage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/nvml"
	"github.com/gpushare/gpushare/plugin/usage/cgroup"
)

// Defaults of the loop's periods.
const (
	// DefaultInterval is the time between readings when Config sets none
	// (the shipped overlays set 10 s too).
	DefaultInterval = 10 * time.Second
	// DefaultGrace is how long a container must stay above its slice before
	// it is reported: long enough that a short spike (a framework's warm-up
	// allocation freed at once) is not an offence.
	DefaultGrace = time.Minute
	// DefaultRepeat is how often a container still above its slice is
	// reported again; the repeats fold into one Event series.
	DefaultRepeat = 5 * time.Minute
	// DefaultPublishEvery bounds the node summary's writes: at most one per
	// 30 s per node, and none while no figure moves.
	DefaultPublishEvery = 30 * time.Second
)

// GPUReader reads the GPUs' use; nvml.Library implements it.
type GPUReader interface {
	Usage() ([]nvml.Usage, error)
}

// EventRecorder is the part of client-go's events.EventRecorder the loop uses.
type EventRecorder interface {
	Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any)
}

// Config is the loop's dependencies and settings.
type Config struct {
	GPUs GPUReader
	// Pods lists the pods bound to the node (an informer's cache).
	Pods func() []*corev1.Pod
	// Owner finds the pod and container of a process; nil reads its cgroup
	// under ProcRoot (package cgroup).
	Owner    func(pid uint32) (cgroup.Owner, bool, error)
	ProcRoot string
	// Unit is the memory unit: slices are counted in it, and the summary is
	// republished when a figure moves by one.
	Unit gpushare.Unit
	// Interval is the time between readings (Run only).
	Interval time.Duration
	// Grace, Repeat and PublishEvery: see the defaults; zero means the default.
	Grace, Repeat, PublishEvery time.Duration
	Metrics                     *Metrics
	// Events records GPUShareOverUse on pods; nil records none.
	Events EventRecorder
	// Publish writes the node summary (the annotation's value); nil
	// publishes nothing.
	Publish func(ctx context.Context, value string) error
	Logger  *zap.Logger
}

// Loop measures the node's GPU use; see the package documentation.
type Loop struct {
	cfg  Config
	over *OverUse
	log  *zap.Logger
	// last is the summary last published and when; zero before the first.
	last   gpushare.NodeUsage
	lastAt time.Time
}

// New checks cfg and returns a loop.
func New(cfg Config) (*Loop, error) {
	if cfg.GPUs == nil || cfg.Pods == nil {
		return nil, errors.New("usage: GPUs and Pods are required")
	}
	if !cfg.Unit.Valid() {
		return nil, fmt.Errorf("usage: invalid memory unit %v", cfg.Unit)
	}
	if cfg.Owner == nil && cfg.ProcRoot == "" {
		return nil, errors.New("usage: neither Owner nor ProcRoot is set")
	}
	if cfg.Owner == nil {
		root := cfg.ProcRoot
		cfg.Owner = func(pid uint32) (cgroup.Owner, bool, error) { return cgroup.Read(root, pid) }
	}
	cfg.Grace = orDefault(cfg.Grace, DefaultGrace)
	cfg.Repeat = orDefault(cfg.Repeat, DefaultRepeat)
	cfg.PublishEvery = orDefault(cfg.PublishEvery, DefaultPublishEvery)
	cfg.Interval = orDefault(cfg.Interval, DefaultInterval)
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	return &Loop{cfg: cfg, over: NewOverUse(cfg.Grace, cfg.Repeat), log: cfg.Logger}, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Run reads the GPUs every Interval until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	t := time.NewTicker(l.cfg.Interval)
	defer t.Stop()
	for {
		l.Step(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Step takes one reading at now: metrics, over-use reports, and the node
// summary when it is due. A failed reading changes nothing but a counter.
func (l *Loop) Step(ctx context.Context, now time.Time) {
	readings, err := l.cfg.GPUs.Usage()
	l.cfg.Metrics.read(err == nil)
	if err != nil {
		l.log.Warn("read the GPUs' use; the last sample stands", zap.Error(err))
		return
	}
	objects := l.cfg.Pods()
	pods := make([]Pod, 0, len(objects))
	byName := make(map[[2]string]*corev1.Pod, len(objects))
	for _, o := range objects {
		p, err := PodOf(o, l.cfg.Unit.MiB()<<20)
		if err != nil {
			l.log.Debug("pod's slices unknown; its use counts without them", zap.Error(err))
		}
		pods = append(pods, p)
		byName[[2]string{o.Namespace, o.Name}] = o
	}
	s := Attribute(readings, l.owners(readings), pods)
	l.cfg.Metrics.observe(s)
	for _, r := range l.over.Observe(now, s) {
		l.report(r, byName[[2]string{r.Namespace, r.Pod}], now)
	}
	l.publish(ctx, s, now)
}

// owners reads the owner of every process using memory. A process that
// exited since NVML listed it is skipped quietly; an unreadable cgroup file
// leaves the process unattributed and is logged.
func (l *Loop) owners(readings []nvml.Usage) map[uint32]cgroup.Owner {
	out := map[uint32]cgroup.Owner{}
	for _, r := range readings {
		for _, p := range r.Processes {
			if _, done := out[p.PID]; done || !p.UsedKnown {
				continue
			}
			o, ok, err := l.cfg.Owner(p.PID)
			switch {
			case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH):
			case err != nil:
				l.log.Debug("process left unattributed", zap.Uint32("pid", p.PID), zap.Error(err))
			case ok:
				out[p.PID] = o
			}
		}
	}
	return out
}

// report records one over-use report on the container's pod.
func (l *Loop) report(r Report, pod *corev1.Pod, now time.Time) {
	l.cfg.Metrics.reported(r.ContainerUse)
	note := OverUseNote(r, now)
	l.log.Warn("container above its GPU memory slice", zap.String("pod", r.Namespace+"/"+r.Pod), zap.String("container", r.Container),
		zap.Int("gpu", r.GPU), zap.Uint64("usedBytes", r.UsedBytes), zap.Uint64("sliceBytes", r.SliceBytes))
	if l.cfg.Events == nil || pod == nil {
		return
	}
	l.cfg.Events.Eventf(pod, nil, corev1.EventTypeWarning, gpushare.EventReasonOverUse, gpushare.EventActionUsageCheck, "%s", gpushare.EventNote(note))
}

// OverUseNote is the Event's note: the container, the GPU, its use and slice, and for how long.
func OverUseNote(r Report, now time.Time) string {
	return fmt.Sprintf("container %s uses %s of GPU %d (%s), above its slice of %s, for %s", r.Container,
		inGiB(r.UsedBytes), r.GPU, r.UUID, inGiB(r.SliceBytes), now.Sub(r.Since).Round(time.Second))
}

// inGiB writes bytes in GiB with one decimal place.
func inGiB(bytes uint64) string {
	return fmt.Sprintf("%.1f GiB", float64(bytes)/(1<<30))
}

// publish writes the node summary when PublishEvery has passed since the
// last write and a figure moved by a unit or more; a failed write is tried
// again at the next reading.
func (l *Loop) publish(ctx context.Context, s Sample, now time.Time) {
	if l.cfg.Publish == nil {
		return
	}
	next := Summary(s, now, l.cfg.Interval)
	if !l.lastAt.IsZero() && (now.Sub(l.lastAt) < l.cfg.PublishEvery || !Moved(l.last, next, l.cfg.Unit.MiB())) {
		return
	}
	value, err := gpushare.EncodeNodeUsage(next)
	if err != nil {
		l.log.Error("encode the node's usage summary", zap.Error(err))
		return
	}
	if err := l.cfg.Publish(ctx, value); err != nil {
		l.log.Warn("publish the node's usage summary; retrying at the next reading", zap.Error(err))
		return
	}
	l.last, l.lastAt = next, now
}

// NodePublisher writes the summary on node's gpushare.io/usage annotation,
// and nothing else (the plugin's admission policy allows that key on its own
// node only), as fieldManager.
func NodePublisher(client kubernetes.Interface, node, fieldManager string) func(context.Context, string) error {
	return func(ctx context.Context, value string) error {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{gpushare.AnnotationNodeUsage: value}}})
		if err != nil {
			return err
		}
		_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: fieldManager})
		return err
	}
}
