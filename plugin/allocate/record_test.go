package allocate_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpushare/gpushare/plugin/allocate"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

func TestRecord(t *testing.T) {
	two := pod("m", []int64{2, 3}, onGPU(1, 80, 1))
	before := two.DeepCopy()
	ann, done, err := allocate.Record(two, "c0", env(1, 5, 2, 80))
	if err != nil || done {
		t.Fatalf("first container: %v, done %v", err, done)
	}
	want := map[string]string{gpushare.AnnotationContainerEnv: `{"c0":{"gpu":1,"pod":5,"container":2,"dev":80}}`}
	if !reflect.DeepEqual(ann, want) {
		t.Errorf("first container: %v; want %v", ann, want)
	}
	if !reflect.DeepEqual(two, before) {
		t.Error("Record modified the pod")
	}
	two.Annotations[gpushare.AnnotationContainerEnv] = ann[gpushare.AnnotationContainerEnv]
	ann, done, err = allocate.Record(two, "c1", env(1, 5, 3, 80))
	if err != nil || !done {
		t.Fatalf("second container: %v, done %v", err, done)
	}
	want = map[string]string{
		gpushare.AnnotationContainerEnv: `{"c0":{"gpu":1,"pod":5,"container":2,"dev":80},"c1":{"gpu":1,"pod":5,"container":3,"dev":80}}`,
		gpushare.AnnotationAssigned:     "true",
	}
	if !reflect.DeepEqual(ann, want) {
		t.Errorf("second container: %v; want %v", ann, want)
	}

	// The seed case also writes the placement, so the extender and the inspector charge the GPU.
	seed := pod("s", []int64{4})
	ann, done, err = allocate.Record(seed, "c0", env(0, 4, 4, 15))
	if err != nil || !done {
		t.Fatalf("seed: %v, done %v", err, done)
	}
	want = map[string]string{
		gpushare.AnnotationContainerEnv: `{"c0":{"gpu":0,"pod":4,"container":4,"dev":15}}`,
		gpushare.AnnotationAssigned:     "true",
		gpushare.AnnotationGPUIndex:     "0",
		gpushare.AnnotationPodUnits:     "4",
		gpushare.AnnotationDevUnits:     "15",
	}
	if !reflect.DeepEqual(ann, want) {
		t.Errorf("seed: %v; want %v", ann, want)
	}
	a, placed, err := gpushare.DecodePodAssignment(ann)
	if err != nil || !placed || !a.Assigned || a.GPUIndex != 0 {
		t.Errorf("seed annotations decode to %+v, %v, %v", a, placed, err)
	}

	bad := pod("b", []int64{4}, onGPU(0, 80, 1), annotate(gpushare.AnnotationContainerEnv, "nope"))
	if _, _, err := allocate.Record(bad, "c0", env(0, 4, 4, 80)); !errors.Is(err, gpushare.ErrInvalidContainerEnvs) {
		t.Errorf("malformed record: %v; want ErrInvalidContainerEnvs", err)
	}
	if _, _, err := allocate.Record(two, "c0", env(0, 1, 4, 80)); !errors.Is(err, gpushare.ErrInvalidContainerEnvs) {
		t.Errorf("impossible env: %v; want ErrInvalidContainerEnvs", err)
	}
}
