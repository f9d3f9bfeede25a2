package explain

import (
	"fmt"
	"strconv"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpushare/gpushare/extender/allocator"
)

// ExplainFit says where pod would land and on which GPUs, and for
// replicas > 1 how many copies fit, placed one after another on a copy of
// the state. Each copy placed is charged as allocated (not in flight): the
// question is capacity, and the hold-back rule only delays copies while the
// device plugin allocates the ones before.
func ExplainFit(st State, pod *corev1.Pod, policy allocator.Policy, replicas int) (*Fit, error) {
	if replicas < 1 {
		return nil, fmt.Errorf("--replicas %d: want 1 or more", replicas)
	}
	r, info, err := request(pod)
	if err != nil {
		return nil, err
	}
	f := &Fit{Unit: unitOf(st), Policy: policy.String(), Pod: info, Replicas: replicas, Placements: []Choice{}}
	views, skipped := buildViews(st, nil)
	f.Skipped = skipped
	for k := range replicas {
		verdicts := judgeAll(views, pod, r, policy, f.Unit)
		if k == 0 {
			f.Nodes = verdicts
		}
		i := best(verdicts)
		if i < 0 {
			if k > 0 {
				f.Stopped = &Stop{Copy: k + 1, Nodes: verdicts}
			}
			f.Help = help(views, pod, r, policy, verdicts, f.Unit)
			break
		}
		f.Placements = append(f.Placements, Choice{Node: verdicts[i].Name, GPUs: verdicts[i].GPUs, Score: verdicts[i].Score})
		p, _ := allocator.Place(views[i].alloc, r, policy) // fits: judge just placed it
		views[i].alloc = charged(views[i].alloc, allocator.Charges(r, p))
	}
	f.Placed = len(f.Placements)
	f.Summary = fitSummary(f)
	return f, nil
}

func fitSummary(f *Fit) string {
	head := "pod " + podName(f.Pod) + " (" + DescribeRequest(f.Pod, f.Unit) + ")"
	switch {
	case f.Placed == 0:
		return summary(f.Pod, f.Nodes, f.Unit)
	case f.Replicas == 1:
		c := f.Placements[0]
		fitting := 0
		for _, v := range f.Nodes {
			if v.Fits {
				fitting++
			}
		}
		return fmt.Sprintf("%s would land on %s, %s (extender score %d; fits on %d of %d nodes)",
			head, c.Node, indices(c.GPUs), c.Score, fitting, len(f.Nodes))
	case f.Placed == f.Replicas:
		return head + ": all " + strconv.Itoa(f.Replicas) + " copies fit"
	}
	return fmt.Sprintf("%s: %d of %d copies fit; copy %d fits nowhere", head, f.Placed, f.Replicas, f.Placed+1)
}
