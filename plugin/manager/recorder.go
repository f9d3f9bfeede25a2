package manager

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/podsource"
)

// DefaultRecordRetry paces the background retries of a failed record write:
// 10 more tries over about two and a half minutes, long enough to ride out
// an API server restart, short enough that a pod that is gone for good does
// not keep a goroutine for long.
func DefaultRecordRetry() wait.Backoff {
	return wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 10, Cap: 30 * time.Second}
}

// errBadRecord marks a record that cannot be computed (a malformed
// container-env annotation, an unreadable request): retrying cannot help.
var errBadRecord = errors.New("cannot compute the record")

// podWriter is the part of podsource.Source the recorder uses.
type podWriter interface {
	PatchPod(ctx context.Context, namespace, name string, uid types.UID, compute func(*corev1.Pod) (map[string]string, error)) error
}

// recorder writes on a pod which environment a container was given (the
// gpushare.io/container-env record and, once complete, ASSIGNED). The first
// write happens during the Allocate call; when it fails, for instance with
// the API server down, the kubelet's answer is still right and the
// allocator's in-memory record keeps the container from being served twice,
// but the inspector, the extender and a restarted plugin rely on the pod's
// record, so the write is retried in the background with backoff.
type recorder struct {
	pods  podWriter
	log   *zap.Logger
	retry wait.Backoff
	// life bounds the background retries: the manager's run, not the
	// kubelet's call, which ends as soon as Allocate answers.
	life context.Context

	mu     sync.Mutex
	closed bool // set by wait: no retry starts after it
	wg     sync.WaitGroup
}

func newRecorder(life context.Context, pods podWriter, retry wait.Backoff, log *zap.Logger) *recorder {
	return &recorder{pods: pods, log: log, retry: retry, life: life}
}

// record writes d on its pod once with ctx; on a failure that a later try
// may overcome it starts a background retry. It returns the first write's
// error and whether a retry was started.
func (r *recorder) record(ctx context.Context, d allocate.Decision) (retrying bool, err error) {
	err = r.write(ctx, d)
	if err == nil || permanent(err) {
		return false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.life.Err() != nil {
		return false, err
	}
	r.wg.Add(1)
	go r.retryWrite(d)
	return true, err
}

// write is one write of d's record, conflicts retried inside.
func (r *recorder) write(ctx context.Context, d allocate.Decision) error {
	container, env := d.Container.Name, d.Env
	return r.pods.PatchPod(ctx, d.Pod.Namespace, d.Pod.Name, d.Pod.UID, func(p *corev1.Pod) (map[string]string, error) {
		ann, _, err := allocate.Record(p, container, env)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errBadRecord, err)
		}
		return ann, nil
	})
}

// permanent reports errors no retry can overcome.
func permanent(err error) bool {
	return errors.Is(err, podsource.ErrPodReplaced) || errors.Is(err, errBadRecord) ||
		apierrors.IsInvalid(err) || apierrors.IsBadRequest(err)
}

// retryWrite retries d's record with r.retry's backoff until it lands, a
// permanent error ends it, the tries run out or the manager stops.
func (r *recorder) retryWrite(d allocate.Decision) {
	defer r.wg.Done()
	log := r.log.With(zap.String("pod", d.Pod.Namespace+"/"+d.Pod.Name), zap.String("container", d.Container.Name))
	b := r.retry // Step changes it; each retry has its own.
	for try := 1; b.Steps > 0; try++ {
		t := time.NewTimer(b.Step())
		select {
		case <-r.life.Done():
			t.Stop()
			log.Warn("stopping: the container's record was not written", zap.Int("tries", try-1))
			return
		case <-t.C:
		}
		err := r.write(r.life, d)
		switch {
		case err == nil:
			log.Info("recorded the container's environment on the pod after retrying", zap.Int("tries", try))
			return
		case permanent(err):
			log.Info("stopped retrying the container's record", zap.Int("tries", try), zap.Error(err))
			return
		case r.life.Err() != nil:
			return
		}
		log.Warn("record the container's environment on the pod: retrying", zap.Int("try", try), zap.Error(err))
	}
	log.Error("gave up recording the container's environment on the pod; "+
		"the container runs with the right GPU, but the inspector and the extender do not see its record "+
		"and a restarted plugin could serve its slot again", zap.Int("tries", r.retry.Steps))
}

// wait returns once every background retry has ended; call it after life
// ended. A record call racing with it (an Allocate still in flight while the
// server stops) starts no retry.
func (r *recorder) wait() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.wg.Wait()
}
