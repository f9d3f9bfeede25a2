// Package manifests reads the repository's manifests/ the way `kubectl apply -k` does for the
// subset of kustomize they use (resources, images and JSON 6902 patches), and applies the objects to a cluster with
// server-side apply. The demo and the end-to-end tests use it, so both run the shipped files.
package manifests

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// Dir returns the repository's manifests directory, found next to this source file so it works
// from any test binary and from `go run` inside the repository.
func Dir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the manifests directory")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "..", "..", "manifests")
	if _, err := os.Stat(filepath.Join(dir, "kustomization.yaml")); err != nil {
		return "", fmt.Errorf("cannot locate the manifests directory: %w", err)
	}
	return filepath.Clean(dir), nil
}

// kustomization is the part of kustomize's Kustomization the manifests use. Load refuses any
// other field, so the manifests cannot drift into kustomize features this reader ignores.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []Image  `json:"images"`
	Patches    []Patch  `json:"patches"`
}

// Image is one entry of a kustomization's images list.
type Image struct {
	Name    string `json:"name"`
	NewName string `json:"newName"`
	NewTag  string `json:"newTag"`
}

// Load reads dir/kustomization.yaml and returns its objects in order: each resource file's
// documents, or, for a directory, that directory's kustomization. The images list is applied to
// every container and init container image, as kustomize does; an images entry that matches no
// image is an error (a renamed image would otherwise silently stop being replaced).
func Load(dir string) ([]*unstructured.Unstructured, error) {
	objs, images, err := load(dir)
	if err != nil {
		return nil, err
	}
	used := make([]bool, len(images))
	for _, o := range objs {
		if err := setImages(o, images, used); err != nil {
			return nil, fmt.Errorf("%s: %w", Describe(o), err)
		}
	}
	for i, u := range used {
		if !u {
			return nil, fmt.Errorf("%s: images entry %q matches no container image", filepath.Join(dir, "kustomization.yaml"), images[i].Name)
		}
	}
	return objs, nil
}

func load(dir string) ([]*unstructured.Unstructured, []Image, error) {
	path := filepath.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if k.Kind != "" && k.Kind != "Kustomization" {
		return nil, nil, fmt.Errorf("%s: kind %q, want Kustomization", path, k.Kind)
	}
	var objs []*unstructured.Unstructured
	images := k.Images
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		st, err := os.Stat(p)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: resource %s: %w", path, r, err)
		}
		if st.IsDir() {
			sub, subImages, err := load(p)
			if err != nil {
				return nil, nil, err
			}
			objs = append(objs, sub...)
			images = append(images, subImages...)
			continue
		}
		fileObjs, err := ReadFile(p)
		if err != nil {
			return nil, nil, err
		}
		objs = append(objs, fileObjs...)
	}
	for _, p := range k.Patches {
		if err := applyPatch(dir, p, objs); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	return objs, images, nil
}

// ReadFile decodes every YAML document of a file into objects; empty documents are skipped, and a
// document without apiVersion, kind or name is an error.
func ReadFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		if len(m) == 0 {
			continue
		}
		o := &unstructured.Unstructured{Object: m}
		if o.GetAPIVersion() == "" || o.GetKind() == "" || o.GetName() == "" {
			return nil, fmt.Errorf("%s: document %d has no apiVersion, kind or metadata.name", path, i)
		}
		objs = append(objs, o)
	}
}

// setImages rewrites the object's container images per images, marking the entries used.
func setImages(o *unstructured.Unstructured, images []Image, used []bool) error {
	podSpec := []string{"spec"}
	switch o.GetKind() {
	case "Pod":
	case "Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job":
		podSpec = []string{"spec", "template", "spec"}
	default:
		return nil
	}
	for _, field := range []string{"initContainers", "containers"} {
		list, found, err := unstructured.NestedSlice(o.Object, append(podSpec, field)...)
		if err != nil {
			return err
		}
		if !found {
			continue
		}
		for _, c := range list {
			c, ok := c.(map[string]any)
			if !ok {
				return fmt.Errorf("%s entry is not an object", field)
			}
			image, _ := c["image"].(string)
			name, tag := splitImage(image)
			for i, im := range images {
				if im.Name != name {
					continue
				}
				used[i] = true
				if im.NewName != "" {
					name = im.NewName
				}
				if im.NewTag != "" {
					tag = im.NewTag
				}
			}
			if tag != "" {
				c["image"] = name + ":" + tag
			} else {
				c["image"] = name
			}
		}
		if err := unstructured.SetNestedSlice(o.Object, list, append(podSpec, field)...); err != nil {
			return err
		}
	}
	return nil
}

// splitImage splits "host:port/path:tag" into name and tag (digests are not used here).
func splitImage(image string) (name, tag string) {
	i := strings.LastIndex(image, ":")
	if i < 0 || strings.Contains(image[i:], "/") {
		return image, ""
	}
	return image[:i], image[i+1:]
}

// Describe names an object for messages: Kind namespace/name.
func Describe(o *unstructured.Unstructured) string {
	if ns := o.GetNamespace(); ns != "" {
		return o.GetKind() + " " + ns + "/" + o.GetName()
	}
	return o.GetKind() + " " + o.GetName()
}

// Applier applies objects with server-side apply through the dynamic client, finding each kind's
// resource through discovery.
type Applier struct {
	client  dynamic.Interface
	mapper  *restmapper.DeferredDiscoveryRESTMapper
	manager string
}

// NewApplier builds an Applier for cfg; fieldManager names the applier in managedFields.
func NewApplier(cfg *rest.Config, fieldManager string) (*Applier, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Applier{client: client, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), manager: fieldManager}, nil
}

// Apply server-side applies one object (forcing ownership of conflicting fields, as
// `kubectl apply --server-side --force-conflicts`) and returns what the API server stored.
// A namespaced object without a namespace goes to namespace "default".
func (a *Applier) Apply(ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := o.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", Describe(o), err)
	}
	data, err := o.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var ri dynamic.ResourceInterface = a.client.Resource(m.Resource)
	if m.Scope.Name() == "namespace" {
		ns := o.GetNamespace()
		if ns == "" {
			ns = metav1.NamespaceDefault
		}
		ri = a.client.Resource(m.Resource).Namespace(ns)
	}
	force := true
	out, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: a.manager, Force: &force})
	if err != nil {
		return nil, fmt.Errorf("apply %s: %w", Describe(o), err)
	}
	return out, nil
}

// ApplyAll applies objs in order and stops at the first error.
func (a *Applier) ApplyAll(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, o := range objs {
		if _, err := a.Apply(ctx, o); err != nil {
			return err
		}
	}
	return nil
}
