package manifests

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// Patch is one entry of a kustomization's patches list: a JSON 6902 patch in Path applied to every
// object Target selects. Strategic-merge patches are not read: their list merging is kustomize's own.
type Patch struct {
	Path   string `json:"path"`
	Target Target `json:"target"`
}

// Target selects objects by kind and name (both required) and, optionally, namespace.
type Target struct {
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

func (t Target) matches(o *unstructured.Unstructured) bool {
	return o.GetKind() == t.Kind && o.GetName() == t.Name && (t.Namespace == "" || o.GetNamespace() == t.Namespace)
}

// applyPatch applies the patch p (relative to dir) to the objects it targets, in place; a patch
// that targets nothing is an error, so a renamed object cannot silently lose its patch.
func applyPatch(dir string, p Patch, objs []*unstructured.Unstructured) error {
	if p.Target.Kind == "" || p.Target.Name == "" {
		return fmt.Errorf("patch %s: target needs kind and name", p.Path)
	}
	ops, err := readJSONPatch(filepath.Join(dir, p.Path))
	if err != nil {
		return err
	}
	n := 0
	for i, o := range objs {
		if !p.Target.matches(o) {
			continue
		}
		doc, err := json.Marshal(o.Object)
		if err != nil {
			return err
		}
		out, err := ops.Apply(doc)
		if err != nil {
			return fmt.Errorf("patch %s on %s: %w", p.Path, Describe(o), err)
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			return err
		}
		objs[i] = &unstructured.Unstructured{Object: m}
		n++
	}
	if n == 0 {
		return fmt.Errorf("patch %s: no %s %s to patch", p.Path, p.Target.Kind, p.Target.Name)
	}
	return nil
}

// readJSONPatch reads a JSON 6902 patch written as a YAML list of operations.
func readJSONPatch(path string) (jsonpatch.Patch, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ops []map[string]any
	if err := yaml.Unmarshal(data, &ops); err != nil {
		return nil, fmt.Errorf("%s: not a JSON 6902 patch (a list of operations): %w", path, err)
	}
	doc, err := json.Marshal(ops)
	if err != nil {
		return nil, err
	}
	patch, err := jsonpatch.DecodePatch(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return patch, nil
}
