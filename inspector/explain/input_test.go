package explain

import (
	"strings"
	"testing"
)

func TestPodFromManifest(t *testing.T) {
	deploy := `apiVersion: apps/v1
kind: Deployment
metadata: {name: infer, namespace: ml}
spec:
  replicas: 3
  selector: {matchLabels: {app: infer}}
  template:
    metadata:
      labels: {app: infer}
      annotations: {gpushare.io/isolation: mps}
    spec:
      containers:
      - name: main
        image: infer
        resources: {limits: {aliyun.com/gpu-mem: 12}}
`
	p, err := PodFromManifest([]byte(deploy), "default", "deploy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if p.Namespace != "ml" || p.Name != "infer" || p.Annotations["gpushare.io/isolation"] != "mps" || len(p.Spec.Containers) != 1 {
		t.Errorf("pod %+v", p)
	}
	job := `{"apiVersion":"batch/v1","kind":"Job","metadata":{"generateName":"train-"},"spec":{"template":{"spec":{"containers":[{"name":"m"}]}}}}`
	if p, err := PodFromManifest([]byte(job), "team", "-"); err != nil || p.Name != "train" || p.Namespace != "team" {
		t.Errorf("job: %+v, %v", p, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"", "no object found"},
		{"kind: ConfigMap\n", "kind ConfigMap has no pod template"},
		{"metadata: {name: x}\n", "no kind"},
		{"kind: Pod\nspec: [\n", "malformed YAML or JSON"},
		{"kind: Pod\nspec: {containers: 3}\n", "malformed Pod"},
		{"kind: Pod\n---\nkind: Pod\n", "2 objects; fit reads one"},
	} {
		if _, err := PodFromManifest([]byte(tc.in), "default", "f.yaml"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
}
