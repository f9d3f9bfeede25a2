// Package fakeapi makes client-go's fake clientset behave like the API server
// where the plugin's correctness depends on it: resourceVersions that change
// on every write and patches refused when they name an old one. Tests and
// benchmarks only.
package fakeapi

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// PatchFaults lets a test fail pod patches by pod name after the reactors are
// installed, without changing the fake clientset under a running client.
type PatchFaults struct {
	mu    sync.Mutex
	fail  func(pod string) error
	tries map[string]int
}

// Set makes every later patch of a pod fail with what fail returns (nil: pass).
func (f *PatchFaults) Set(fail func(pod string) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = fail
}

// check counts a patch of pod and returns the fault to answer it with.
func (f *PatchFaults) check(pod string) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.tries == nil {
		f.tries = map[string]int{}
	}
	f.tries[pod]++
	if f.fail == nil {
		return nil
	}
	return f.fail(pod)
}

// Tries returns how many patches of pod were seen.
func (f *PatchFaults) Tries(pod string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tries[pod]
}

// KeepResourceVersions makes the fake clientset keep resourceVersions on
// pods and refuse an annotation patch that names another one, with a
// Conflict, as the API server does (the fake neither sets nor checks them);
// without it two records written from one stale copy silently overwrite
// each other. It handles the merge patches the plugin sends: metadata
// annotations under a resourceVersion precondition (created pods have an
// empty one here, which is compared like any other). faults, when not nil,
// may fail patches first. Install it before the client is used.
func KeepResourceVersions(client *fake.Clientset, faults *PatchFaults) {
	// Creates and updates get a new resourceVersion too, as on the API server,
	// so a reader can tell a changed pod from the copy it has.
	var version atomic.Int64
	version.Store(1000)
	stamp := func(action k8stesting.Action) (bool, runtime.Object, error) {
		if a, ok := action.(interface{ GetObject() runtime.Object }); ok {
			if pod, ok := a.GetObject().(*corev1.Pod); ok {
				pod.ResourceVersion = strconv.FormatInt(version.Add(1), 10)
			}
		}
		return false, nil, nil
	}
	client.PrependReactor("create", "pods", stamp)
	client.PrependReactor("update", "pods", stamp)
	client.PrependReactor("patch", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		pa := action.(k8stesting.PatchAction)
		if err := faults.check(pa.GetName()); err != nil {
			return true, nil, err
		}
		var patch struct {
			Metadata struct {
				ResourceVersion *string            `json:"resourceVersion"`
				Annotations     map[string]*string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(pa.GetPatch(), &patch); err != nil || patch.Metadata.ResourceVersion == nil {
			return false, nil, nil
		}
		obj, err := client.Tracker().Get(pa.GetResource(), pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		pod := obj.(*corev1.Pod).DeepCopy()
		if pod.ResourceVersion != *patch.Metadata.ResourceVersion {
			return true, nil, apierrors.NewConflict(pa.GetResource().GroupResource(), pa.GetName(),
				fmt.Errorf("resourceVersion %q is not the stored %q", *patch.Metadata.ResourceVersion, pod.ResourceVersion))
		}
		if pod.Annotations == nil {
			pod.Annotations = map[string]string{}
		}
		for k, v := range patch.Metadata.Annotations {
			if v == nil {
				delete(pod.Annotations, k)
			} else {
				pod.Annotations[k] = *v
			}
		}
		pod.ResourceVersion = strconv.FormatInt(version.Add(1), 10)
		if err := client.Tracker().Update(pa.GetResource(), pod, pa.GetNamespace()); err != nil {
			return true, nil, err
		}
		return true, pod, nil
	})
}
