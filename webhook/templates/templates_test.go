package templates

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpushare/gpushare/webhook/translate"
)

// clientView reads the fake clientset directly, as the informers would
// once synced.
type clientView struct {
	client *fake.Clientset
}

func (v clientView) Templates() []*resourceapi.ResourceClaimTemplate {
	l, _ := v.client.ResourceV1().ResourceClaimTemplates("").List(context.Background(), metav1.ListOptions{LabelSelector: Selector()})
	out := []*resourceapi.ResourceClaimTemplate{}
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out
}

func (v clientView) Pods() []*corev1.Pod {
	l, _ := v.client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{})
	out := []*corev1.Pod{}
	for i := range l.Items {
		out = append(out, &l.Items[i])
	}
	return out
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func names(v clientView) []string {
	var out []string
	for _, t := range v.Templates() {
		out = append(out, t.Namespace+"/"+t.Name)
	}
	slices.Sort(out)
	return out
}

func podNaming(ns, name, template string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpushare-gpu-mem", ResourceClaimTemplateName: ptr.To(template)}}}}
}

func TestEnsureMakesOnce(t *testing.T) {
	client := fake.NewClientset()
	view := clientView{client}
	k := New(client, view, time.Minute, time.Now, zap.NewNop())
	s := translate.Shape{MiB: []uint64{4096}, Count: 1}
	for range 3 {
		if err := k.Ensure(context.Background(), "team", s); err != nil {
			t.Fatal(err)
		}
	}
	if got := names(view); !slices.Equal(got, []string{"team/gpushare-4gi"}) {
		t.Errorf("templates %v", got)
	}
	creates := 0
	for _, a := range client.Actions() {
		if a.GetVerb() == "create" {
			creates++
		}
	}
	if creates != 1 {
		t.Errorf("%d creates; the view showed the template after the first", creates)
	}
}

// A template named by no pod goes after the grace period, not before; one a
// pod names stays; one a pod names that is gone is made again; one Ensure
// vouched for lately stays though no pod is seen yet.
func TestSweep(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	view := clientView{client}
	c := &clock{t: time.Unix(1000, 0)}
	k := New(client, view, 10*time.Minute, c.now, zap.NewNop())
	four := translate.Shape{MiB: []uint64{4096}, Count: 1}
	two := translate.Shape{MiB: []uint64{2048}, Count: 1}
	for _, s := range []translate.Shape{four, two} {
		if err := k.Ensure(ctx, "team", s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.CoreV1().Pods("team").Create(ctx, podNaming("team", "a", "gpushare-4gi"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod names a template of ours that is gone, and another of someone else's.
	for _, p := range []*corev1.Pod{podNaming("other", "b", "gpushare-8gi-x2"), podNaming("other", "c", "their-template")} {
		if _, err := client.CoreV1().Pods("other").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		after time.Duration
		want  []string
	}{
		{0, []string{"other/gpushare-8gi-x2", "team/gpushare-2gi", "team/gpushare-4gi"}},
		{9 * time.Minute, []string{"other/gpushare-8gi-x2", "team/gpushare-2gi", "team/gpushare-4gi"}}, // vouched for 9 min ago
		{2 * time.Minute, []string{"other/gpushare-8gi-x2", "team/gpushare-2gi", "team/gpushare-4gi"}}, // unnamed since now
		{10 * time.Minute, []string{"other/gpushare-8gi-x2", "team/gpushare-4gi"}},
	}
	for i, st := range steps {
		c.t = c.t.Add(st.after)
		if err := k.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		if got := names(view); !slices.Equal(got, st.want) {
			t.Errorf("step %d: templates %v; want %v", i, got, st.want)
		}
	}
	// Ensure starts the clock again for a template the sweep was about to delete.
	if err := client.CoreV1().Pods("team").Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(time.Minute)
	_ = k.Sweep(ctx)
	c.t = c.t.Add(9 * time.Minute)
	if err := k.Ensure(ctx, "team", four); err != nil {
		t.Fatal(err)
	}
	c.t = c.t.Add(5 * time.Minute)
	_ = k.Sweep(ctx)
	if got := names(view); !slices.Contains(got, "team/gpushare-4gi") {
		t.Errorf("templates %v: the template Ensure vouched for 5 min ago was deleted", got)
	}
}

// A template changed since the sweep read it is kept: the delete is
// conditional on the version read.
func TestSweepDeletesOnlyTheVersionRead(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	k := New(client, clientView{client}, time.Minute, time.Now, zap.NewNop())
	stale := translate.Shape{MiB: []uint64{1024}, Count: 1}.Template("team")
	stale.UID, stale.ResourceVersion = "old-uid", "1"
	err := k.delete(ctx, stale)
	if err != nil {
		t.Fatalf("deleting a template that is gone: %v", err)
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "delete" {
			d := a.(interface{ GetDeleteOptions() metav1.DeleteOptions }).GetDeleteOptions()
			if d.Preconditions == nil || *d.Preconditions.UID != "old-uid" || *d.Preconditions.ResourceVersion != "1" {
				t.Errorf("delete without the version read: %+v", d.Preconditions)
			}
		}
	}
}
