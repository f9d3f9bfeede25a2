package preempt

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// TestAmendProperties: over random nodes and random scheduler victims (lower
// priority pods, some also holding CPU, plus pods the extender does not
// know), the answer keeps every victim that is not droppable, drops only
// droppable ones, adds only evictable lower-priority GPU pods, and the pod
// then fits by Place; it is the scheduler's set unchanged whenever the pod
// fits once they are gone; and "no answer" only when not even evicting every
// lower-priority pod as well makes it fit.
func TestAmendProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(23, 2))
	unchanged, amended, dropped, noes := 0, 0, 0, 0
	for i := range 20000 {
		n, hs, r, prio, policy := randomCase(rng)
		for k := range hs {
			hs[k].GPUMemOnly = rng.IntN(2) == 0
		}
		var theirs []string
		for _, h := range hs {
			if h.Priority < prio && rng.IntN(3) == 0 {
				theirs = append(theirs, h.UID)
			}
		}
		if rng.IntN(2) == 0 {
			theirs = append(theirs, "cpu-only") // a pod the extender does not hold
		}
		mayDrop := rng.IntN(4) != 0
		desc := func() string {
			return fmt.Sprintf("case %d: node %+v holders %+v theirs %v request %+v priority %d policy %s mayDrop %v", i, n, hs, theirs, r, prio, policy, mayDrop)
		}
		byUID := map[string]Holder{}
		var gone []Holder
		for _, h := range hs {
			byUID[h.UID] = h
			if slices.Contains(theirs, h.UID) {
				gone = append(gone, h)
			}
		}
		a, ok := Amend(n, hs, theirs, r, prio, policy, mayDrop)
		if !ok {
			noes++
			all := slices.Clone(gone)
			for _, h := range hs {
				if h.Evictable && h.Priority < prio && !slices.Contains(theirs, h.UID) {
					all = append(all, h)
				}
			}
			if fitsOn(Without(n, all), r, policy) {
				t.Fatalf("%s: no answer, but it fits without the scheduler's victims and every lower-priority pod", desc())
			}
			continue
		}
		if fitsOn(Without(n, gone), r, policy) {
			if len(a.Add) != 0 || len(a.Drop) != 0 {
				t.Fatalf("%s: fits once the scheduler's victims are gone, yet amended %+v", desc(), a)
			}
			unchanged++
			continue
		}
		amended++
		if len(a.Add) == 0 {
			t.Fatalf("%s: it does not fit without the scheduler's victims, and nothing was added", desc())
		}
		final := map[string]Holder{}
		for _, uid := range theirs {
			if h, known := byUID[uid]; known {
				final[uid] = h
			}
		}
		for _, uid := range a.Drop {
			h := byUID[uid]
			if !mayDrop || !h.GPUMemOnly || !h.Evictable || !slices.Contains(theirs, uid) {
				t.Fatalf("%s: dropped %s, which is not droppable", desc(), uid)
			}
			delete(final, uid)
			dropped++
		}
		for _, h := range a.Add {
			if !h.Evictable || h.Priority >= prio || slices.Contains(theirs, h.UID) {
				t.Fatalf("%s: added %+v", desc(), h)
			}
			final[h.UID] = h
		}
		var victims []Holder
		for _, h := range final {
			victims = append(victims, h)
		}
		if !fitsOn(Without(n, victims), r, policy) {
			t.Fatalf("%s: amended %+v, and it does not fit without the answer", desc(), a)
		}
	}
	if unchanged < 500 || amended < 500 || dropped < 200 || noes < 500 {
		t.Fatalf("unchanged %d, amended %d, dropped %d, no answer %d: the generator is lopsided", unchanged, amended, dropped, noes)
	}
}

func TestGPUMemOnly(t *testing.T) {
	gpu := func(more corev1.ResourceList) *corev1.Pod {
		l := corev1.ResourceList{gpushare.ResourceName: resource.MustParse("4")}
		for k, v := range more {
			l[k] = v
		}
		return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Limits: l}}}}}
	}
	if !GPUMemOnly(gpu(nil)) {
		t.Error("a pod asking only gpu-mem: want GPUMemOnly")
	}
	if !GPUMemOnly(gpu(corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("0")})) {
		t.Error("a zero CPU request asks for nothing: want GPUMemOnly")
	}
	cases := map[string]func(p *corev1.Pod){
		"cpu": func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
		},
		"init memory": func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}}}
		},
		"overhead": func(p *corev1.Pod) {
			p.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}
		},
		"host port": func(p *corev1.Pod) {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080}}
		},
		"claim": func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}}}
		},
		"resource claim": func(p *corev1.Pod) { p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu"}} },
		"anti-affinity": func(p *corev1.Pod) {
			p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: "zone"}}}}
		},
	}
	for name, edit := range cases {
		p := gpu(nil)
		edit(p)
		if GPUMemOnly(p) {
			t.Errorf("%s: GPUMemOnly, want false", name)
		}
	}
	p := gpu(nil)
	if !NeedsOnlyResources(p) {
		t.Error("a plain preemptor: want NeedsOnlyResources")
	}
	p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{WhenUnsatisfiable: corev1.DoNotSchedule}}
	if NeedsOnlyResources(p) {
		t.Error("hard topology spread: want !NeedsOnlyResources")
	}
	p.Spec.TopologySpreadConstraints[0].WhenUnsatisfiable = corev1.ScheduleAnyway
	if !NeedsOnlyResources(p) {
		t.Error("soft topology spread: want NeedsOnlyResources")
	}
}
