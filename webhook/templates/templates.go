// Package templates keeps the webhook's ResourceClaimTemplates: it makes
// one when a pod needs it, makes it again when a pod names one that is gone,
// and deletes those no pod has named for a grace period. Its state is the
// templates and pods themselves (a template's name is its shape), so a
// restart loses nothing but the grace periods' clocks, which start again.
package templates

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/webhook/translate"
)

// Key names a template.
type Key struct{ Namespace, Name string }

// View is what the keeper reads of the cluster, from informers' stores.
type View interface {
	// Templates is every template labelled as the webhook's.
	Templates() []*resourceapi.ResourceClaimTemplate
	// Pods is every pod not yet finished (neither Succeeded nor Failed).
	Pods() []*corev1.Pod
}

// Keeper makes and deletes the webhook's templates.
type Keeper struct {
	client kubernetes.Interface
	view   View
	grace  time.Duration
	now    func() time.Time
	log    *zap.Logger

	mu sync.Mutex
	// used is when Ensure last vouched for a template: a pod being admitted
	// names it before any informer shows the pod.
	used map[Key]time.Time
	// unusedSince is when a sweep first found a template named by no pod.
	unusedSince map[Key]time.Time
}

// New returns a Keeper deleting templates no pod named for grace.
func New(client kubernetes.Interface, view View, grace time.Duration, now func() time.Time, log *zap.Logger) *Keeper {
	return &Keeper{client: client, view: view, grace: grace, now: now, log: log,
		used: map[Key]time.Time{}, unusedSince: map[Key]time.Time{}}
}

// Ensure makes the shape's template in namespace unless it exists.
func (k *Keeper) Ensure(ctx context.Context, namespace string, s translate.Shape) error {
	key := Key{namespace, s.Name()}
	k.mu.Lock()
	k.used[key] = k.now()
	delete(k.unusedSince, key)
	k.mu.Unlock()
	for _, t := range k.view.Templates() {
		if t.Namespace == namespace && t.Name == key.Name && t.DeletionTimestamp == nil {
			return nil
		}
	}
	return k.create(ctx, namespace, s)
}

func (k *Keeper) create(ctx context.Context, namespace string, s translate.Shape) error {
	_, err := k.client.ResourceV1().ResourceClaimTemplates(namespace).Create(ctx, s.Template(namespace), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("creating %s/%s: %w", namespace, s.Name(), err)
	}
	k.log.Info("made claim template", zap.String("namespace", namespace), zap.String("template", s.Name()))
	return nil
}

// Sweep makes again every template a pod names that is gone, and deletes
// those no pod has named for the grace period. The delete is conditional
// on the version swept, so a template changed since is kept.
func (k *Keeper) Sweep(ctx context.Context) error {
	named := map[Key]bool{}
	for _, p := range k.view.Pods() {
		for _, c := range p.Spec.ResourceClaims {
			if c.ResourceClaimTemplateName != nil {
				named[Key{p.Namespace, *c.ResourceClaimTemplateName}] = true
			}
		}
	}
	existing := map[Key]bool{}
	var firstErr error
	for _, t := range k.view.Templates() {
		key := Key{t.Namespace, t.Name}
		existing[key] = true
		if named[key] || !k.expired(key) {
			continue
		}
		if err := k.delete(ctx, t); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	for key := range named {
		if existing[key] {
			continue
		}
		s, err := translate.ParseName(key.Name)
		if err != nil {
			continue // not one of ours
		}
		if err := k.create(ctx, key.Namespace, s); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	k.forgetGone(existing)
	return firstErr
}

// expired tells whether key has gone unnamed for the grace period, starting
// its clock if this is the first sweep to find it unnamed.
func (k *Keeper) expired(key Key) bool {
	now := k.now()
	k.mu.Lock()
	defer k.mu.Unlock()
	if used, ok := k.used[key]; ok && now.Sub(used) < k.grace {
		return false
	}
	since, ok := k.unusedSince[key]
	if !ok {
		k.unusedSince[key] = now
		return false
	}
	return now.Sub(since) >= k.grace
}

func (k *Keeper) delete(ctx context.Context, t *resourceapi.ResourceClaimTemplate) error {
	uid, rv := t.UID, t.ResourceVersion
	err := k.client.ResourceV1().ResourceClaimTemplates(t.Namespace).Delete(ctx, t.Name,
		metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil
	case err != nil:
		return fmt.Errorf("deleting %s/%s: %w", t.Namespace, t.Name, err)
	}
	k.log.Info("deleted unused claim template", zap.String("namespace", t.Namespace), zap.String("template", t.Name))
	return nil
}

// forgetGone drops the clocks of templates that no longer exist.
func (k *Keeper) forgetGone(existing map[Key]bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for key := range k.unusedSince {
		if !existing[key] {
			delete(k.unusedSince, key)
		}
	}
	for key, at := range k.used {
		if !existing[key] && k.now().Sub(at) >= k.grace {
			delete(k.used, key)
		}
	}
}

// Run sweeps every interval until ctx ends.
func (k *Keeper) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := k.Sweep(ctx); err != nil {
				k.log.Warn("sweeping claim templates", zap.Error(err))
			}
		}
	}
}

// Selector is the label selector of the webhook's templates.
func Selector() string { return gpushare.LabelManagedBy + "=" + gpushare.ManagedByWebhook }
