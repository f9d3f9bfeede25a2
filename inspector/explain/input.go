package explain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// maxManifestBytes bounds what fit reads: a pod template is a few KiB.
const maxManifestBytes = 4 << 20

// PodFromManifest reads one object, YAML or JSON, and returns the pod it
// would create: a Pod as is, or the pod template of a Deployment,
// StatefulSet, ReplicaSet, Job or CronJob, named after the object. The
// namespace is the object's, else namespace. source names the input in errors.
func PodFromManifest(data []byte, namespace, source string) (*corev1.Pod, error) {
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes; fit reads one object", source, maxManifestBytes)
	}
	raw, err := oneDocument(data, source)
	if err != nil {
		return nil, err
	}
	var head metav1.TypeMeta
	if err := json.Unmarshal(raw, &head); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	meta, spec, err := template(raw, head.Kind)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	// A template's nodeName stays: the NodeName predicate then keeps the
	// other nodes out, as kube-scheduler would.
	pod := &corev1.Pod{ObjectMeta: meta, Spec: spec}
	if pod.Namespace == "" {
		pod.Namespace = namespace
	}
	if pod.Name == "" {
		pod.Name = strings.TrimSuffix(pod.GenerateName, "-")
	}
	if pod.Name == "" {
		pod.Name = "fit"
	}
	return pod, nil
}

// oneDocument decodes the single object of data to JSON; several objects
// or none is an error, since fit answers for one pod.
func oneDocument(data []byte, source string) ([]byte, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var docs []json.RawMessage
	for {
		var doc json.RawMessage
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: malformed YAML or JSON: %w", source, err)
		}
		if len(bytes.TrimSpace(doc)) > 0 && string(bytes.TrimSpace(doc)) != "null" {
			docs = append(docs, doc)
		}
	}
	switch len(docs) {
	case 0:
		return nil, fmt.Errorf("%s: no object found; fit reads a Pod, Deployment, StatefulSet, ReplicaSet, Job or CronJob", source)
	case 1:
		return docs[0], nil
	}
	return nil, fmt.Errorf("%s: %d objects; fit reads one (split the file, or pass one with -f)", source, len(docs))
}

// template returns the metadata and spec of the pod raw (of kind) creates;
// the object's name and namespace stand in for the pod's.
func template(raw []byte, kind string) (metav1.ObjectMeta, corev1.PodSpec, error) {
	var meta metav1.ObjectMeta
	var spec corev1.PodSpec
	pick := func(obj metav1.ObjectMeta, t corev1.PodTemplateSpec) {
		meta, spec = t.ObjectMeta, t.Spec
		meta.Name, meta.Namespace, meta.GenerateName = obj.Name, obj.Namespace, obj.GenerateName
	}
	var err error
	switch kind {
	case "Pod":
		var o corev1.Pod
		if err = json.Unmarshal(raw, &o); err == nil {
			meta, spec = o.ObjectMeta, o.Spec
		}
	case "Deployment":
		var o appsv1.Deployment
		if err = json.Unmarshal(raw, &o); err == nil {
			pick(o.ObjectMeta, o.Spec.Template)
		}
	case "StatefulSet":
		var o appsv1.StatefulSet
		if err = json.Unmarshal(raw, &o); err == nil {
			pick(o.ObjectMeta, o.Spec.Template)
		}
	case "ReplicaSet":
		var o appsv1.ReplicaSet
		if err = json.Unmarshal(raw, &o); err == nil {
			pick(o.ObjectMeta, o.Spec.Template)
		}
	case "Job":
		var o batchv1.Job
		if err = json.Unmarshal(raw, &o); err == nil {
			pick(o.ObjectMeta, o.Spec.Template)
		}
	case "CronJob":
		var o batchv1.CronJob
		if err = json.Unmarshal(raw, &o); err == nil {
			pick(o.ObjectMeta, o.Spec.JobTemplate.Spec.Template)
		}
	case "":
		return meta, spec, errors.New("no kind: fit reads a Pod, Deployment, StatefulSet, ReplicaSet, Job or CronJob")
	default:
		return meta, spec, fmt.Errorf("kind %s has no pod template: fit reads a Pod, Deployment, StatefulSet, ReplicaSet, Job or CronJob", kind)
	}
	if err != nil {
		return meta, spec, fmt.Errorf("malformed %s: %w", kind, err)
	}
	return meta, spec, nil
}
