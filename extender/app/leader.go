package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// LeaderElection makes the extender one of several replicas of which only the
// holder of a Lease serves filter, prioritize and bind.
type LeaderElection struct {
	// Client reads and writes the Lease; nil means Config.Client. A client of
	// its own keeps a burst of binds from starving renewals of its rate limit.
	Client    kubernetes.Interface
	Namespace string
	Name      string
	// Identity must be unique among the replicas.
	Identity string
	// LeaseDuration (whole seconds, at least one: the Lease stores seconds),
	// RenewDeadline and RetryPeriod as client-go's leaderelection; RenewDeadline
	// must be shorter than LeaseDuration and longer than 1.2 RetryPeriod.
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// leadership decides whether this replica may serve the verbs now. Without an
// election it always may. With one, it may from the moment its cache has
// caught up after acquiring the Lease until the earliest of: the elector
// stopping, the process stopping, or RenewDeadline passing since the last
// Lease write that named it holder was sent. That last bound is a fence of our
// own: client-go notices a failed renewal only when its retries run out and
// may spend up to another RenewDeadline releasing, while another replica can
// take over LeaseDuration after it last saw the Lease change, which is after
// we sent that change.
type leadership struct {
	elect         bool
	identity      string
	renewDeadline time.Duration
	leaseDuration time.Duration // as the Lease stores it: whole seconds
	now           func() time.Time

	mu      sync.Mutex
	leading bool
	retired bool      // the process is stopping: no term may start serving again
	renewed time.Time // send time of the last successful write naming us holder; zero when none
	leader  string    // last observed holder, for messages

	// requests is held shared by every verb request the leader serves, so
	// stepping down can wait for them before the Lease is released.
	requests sync.RWMutex
}

func newLeadership(le *LeaderElection) *leadership {
	l := &leadership{elect: le != nil, now: time.Now}
	if le != nil {
		l.identity = le.Identity
		l.renewDeadline = le.RenewDeadline
		l.leaseDuration = le.LeaseDuration
	}
	return l
}

// serving reports whether this replica may answer the verbs now.
func (l *leadership) serving() bool {
	if !l.elect {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.servingLocked()
}

func (l *leadership) servingLocked() bool {
	return l.leading && !l.renewed.IsZero() && l.now().Before(l.renewed.Add(l.renewDeadline))
}

// start begins serving unless the term that ctx belongs to is already over
// (the elector cancels it before calling stop, so a late start cannot undo
// a stop).
func (l *leadership) start(ctx context.Context) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ctx.Err() != nil || l.retired {
		return false
	}
	l.leading = true
	return true
}

// stop ends serving at once.
func (l *leadership) stop() {
	l.mu.Lock()
	l.leading = false
	l.mu.Unlock()
}

// retire ends serving for good, even if a takeover finishes after it.
func (l *leadership) retire() {
	l.mu.Lock()
	l.leading, l.retired = false, true
	l.mu.Unlock()
}

// drain retires and waits for the verb requests already running.
func (l *leadership) drain() {
	l.retire()
	// Lock returns once every running request has released its read lock.
	l.requests.Lock()
	l.requests.Unlock() //nolint:staticcheck // the empty critical section is the wait
}

// wrote records a Lease write sent at sent: ours when it names us holder
// (err is then its outcome), otherwise a release, recorded before it is sent.
func (l *leadership) wrote(ours bool, sent time.Time, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case !ours:
		l.renewed = time.Time{}
	case err == nil:
		l.renewed = sent
	}
}

func (l *leadership) observed(identity string) {
	l.mu.Lock()
	l.leader = identity
	l.mu.Unlock()
}

func (l *leadership) notLeader() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch l.leader {
	case "":
		return "not the leader (no leader observed yet)"
	case l.identity:
		return "holding the Lease but not serving (taking over, or renewals overdue)"
	}
	return "not the leader (the leader is " + l.leader + ")"
}

// gauge is 1 while this replica serves the verbs.
func (l *leadership) gauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpushare_extender_leader",
		Help: "1 while this replica serves filter, prioritize and bind (the leader, or the only replica without leader election), else 0.",
	}, func() float64 {
		if l.serving() {
			return 1
		}
		return 0
	})
}

// handler gates next: a replica that is not serving answers the verbs and
// /readyz with 503, so the Service routes only to the leader; everything else
// (/healthz, /version, /metrics, /inspect) is served by every replica. The
// patterns are the server's own, so no path reaches a verb around the gate.
func (l *leadership) handler(next http.Handler) http.Handler {
	if !l.elect {
		return next
	}
	mux := http.NewServeMux()
	for _, verb := range []string{"filter", "prioritize", "bind"} {
		mux.HandleFunc("POST "+gpushare.ExtenderURLPrefix+"/"+verb, func(w http.ResponseWriter, r *http.Request) {
			l.requests.RLock()
			defer l.requests.RUnlock()
			l.mu.Lock()
			ok, end := l.servingLocked(), l.renewed.Add(l.leaseDuration)
			l.mu.Unlock()
			if !ok {
				writeError(w, http.StatusServiceUnavailable, l.notLeader())
				return
			}
			// A bind must not outlive the term it started in: from then on
			// another replica may be placing pods without seeing it.
			ctx, cancel := context.WithDeadline(r.Context(), end)
			defer cancel()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !l.serving() {
			http.Error(w, l.notLeader(), http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})
	mux.Handle("/", next)
	return mux
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The extender's error shape ({"Error": ...}), as the server writes it.
	_ = json.NewEncoder(w).Encode(struct{ Error string }{msg})
}

// fencedLock is the Lease lock, telling leadership about every write so it
// can stop serving on its own clock when renewals stop succeeding.
type fencedLock struct {
	resourcelock.Interface
	lead *leadership
}

// Create implements resourcelock.Interface.
func (f *fencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return f.write(r, func() error { return f.Interface.Create(ctx, r) })
}

// Update implements resourcelock.Interface.
func (f *fencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return f.write(r, func() error { return f.Interface.Update(ctx, r) })
}

func (f *fencedLock) write(r resourcelock.LeaderElectionRecord, do func() error) error {
	ours := r.HolderIdentity == f.Identity()
	sent := f.lead.now()
	if !ours {
		f.lead.wrote(false, sent, nil) // a release: stop serving before it is sent
	}
	err := do()
	if ours {
		f.lead.wrote(true, sent, err)
	}
	return err
}

// elector builds the leader elector. Leading runs lead in a goroutine of the
// caller's (the elector starts its callback with go and does not wait for
// it), so the returned started channel carries the term's context instead.
func (l *leadership) elector(le *LeaderElection, client kubernetes.Interface, log *zap.Logger) (*leaderelection.LeaderElector, <-chan context.Context, error) {
	if le.LeaseDuration < time.Second || le.LeaseDuration%time.Second != 0 {
		// Others read the duration from the Lease, in whole seconds: a fraction
		// would make them take over before this replica's renew deadline.
		return nil, nil, fmt.Errorf("leader election: lease duration %v must be a whole number of seconds, at least one", le.LeaseDuration)
	}
	if le.Identity == "" || le.Name == "" || le.Namespace == "" {
		return nil, nil, errors.New("leader election: identity, name and namespace are required")
	}
	if le.Client != nil {
		client = le.Client
	}
	lock := &fencedLock{lead: l, Interface: &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: le.Namespace, Name: le.Name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: le.Identity},
	}}
	started := make(chan context.Context, 1) // at most one term per Run
	e, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:          lock,
		LeaseDuration: le.LeaseDuration,
		RenewDeadline: le.RenewDeadline,
		RetryPeriod:   le.RetryPeriod,
		// Run drains the verb requests before cancelling the elector, so the
		// Lease is released only when nothing of this term can still bind.
		ReleaseOnCancel: true,
		Name:            le.Namespace + "/" + le.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) { started <- ctx },
			OnStoppedLeading: func() {
				if l.serving() {
					log.Warn("stopped leading")
				}
				l.stop()
			},
			OnNewLeader: func(id string) {
				l.observed(id)
				log.Info("leader observed", zap.String("leader", id), zap.Bool("self", id == le.Identity))
			},
		},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("leader election: %w", err)
	}
	return e, started, nil
}

// takeOver makes a new leader's view at least as recent as the API server's
// and then starts serving. The previous leader stopped binding before this
// replica could acquire the Lease, so every bind it made is in a quorum read
// done now; the informer may still lag behind it, and placing pods from an
// older view could give the same GPU memory away twice. Feeding the pods of
// that read into the cache (by UID, never replacing what the informer knows)
// closes the gap without comparing resource versions, which are opaque, and
// without waiting on an informer that may have nothing new to deliver.
func (l *leadership) takeOver(ctx context.Context, c *cache.Cache, client kubernetes.Interface, retry time.Duration, log *zap.Logger) {
	start := time.Now()
	if !c.WaitForSync(ctx) {
		return
	}
	for {
		added, err := catchUp(ctx, c, client)
		if err == nil {
			if l.start(ctx) {
				log.Info("leading", zap.Int("pods added by the catch-up", added), zap.Duration("took", time.Since(start)))
			}
			return
		}
		log.Warn("catch-up LIST failed; not serving yet", zap.Error(err))
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// catchUp lists the bound, unfinished pods with resourceVersion "" (a quorum
// read, never served from a stale cache) page by page into the cache.
func catchUp(ctx context.Context, c *cache.Cache, client kubernetes.Interface) (int, error) {
	opts := metav1.ListOptions{
		FieldSelector: fields.AndSelectors(
			fields.OneTermNotEqualSelector("spec.nodeName", ""),
			fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
			fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
		).String(),
		Limit: 500,
	}
	added := 0
	for {
		// The first page is the quorum read; the rest continue that snapshot.
		list, err := client.CoreV1().Pods("").List(ctx, opts)
		if err != nil {
			return added, fmt.Errorf("list pods: %w", err)
		}
		added += c.CatchUp(list.Items)
		if list.Continue == "" {
			return added, nil
		}
		opts.Continue = list.Continue
	}
}
