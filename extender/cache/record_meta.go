package cache

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// PodRecord implements metav1.Object so that client-go's store and shared
// informer can key it and compare versions (meta.Accessor). They read only
// the namespace, the name and the resource version; the UID, annotations and
// deletion state are answered truthfully too. The record keeps nothing else:
// the other getters return zero values and the other setters do nothing.
var _ metav1.Object = (*PodRecord)(nil)

func (r *PodRecord) GetNamespace() string                { return r.Namespace }
func (r *PodRecord) SetNamespace(namespace string)       { r.Namespace = namespace }
func (r *PodRecord) GetName() string                     { return r.Name }
func (r *PodRecord) SetName(name string)                 { r.Name = name }
func (r *PodRecord) GetUID() types.UID                   { return r.UID }
func (r *PodRecord) SetUID(uid types.UID)                { r.UID = uid }
func (r *PodRecord) GetResourceVersion() string          { return r.ResourceVersion }
func (r *PodRecord) SetResourceVersion(version string)   { r.ResourceVersion = version }
func (r *PodRecord) GetAnnotations() map[string]string   { return r.Annotations }
func (r *PodRecord) SetAnnotations(a map[string]string)  { r.Annotations = keptAnnotations(a) }
func (r *PodRecord) SetDeletionTimestamp(t *metav1.Time) { r.Terminating = t != nil }

// GetDeletionTimestamp returns nil, or for a terminating pod a zero time:
// the record keeps whether the pod is being deleted, not since when.
func (r *PodRecord) GetDeletionTimestamp() *metav1.Time {
	if r.Terminating {
		return &metav1.Time{}
	}
	return nil
}

// Not kept.

func (r *PodRecord) GetGenerateName() string                                    { return "" }
func (r *PodRecord) SetGenerateName(string)                                     {}
func (r *PodRecord) GetGeneration() int64                                       { return 0 }
func (r *PodRecord) SetGeneration(int64)                                        {}
func (r *PodRecord) GetSelfLink() string                                        { return "" }
func (r *PodRecord) SetSelfLink(string)                                         {}
func (r *PodRecord) GetCreationTimestamp() metav1.Time                          { return metav1.Time{} }
func (r *PodRecord) SetCreationTimestamp(metav1.Time)                           {}
func (r *PodRecord) GetDeletionGracePeriodSeconds() *int64                      { return nil }
func (r *PodRecord) SetDeletionGracePeriodSeconds(*int64)                       {}
func (r *PodRecord) GetLabels() map[string]string                               { return nil }
func (r *PodRecord) SetLabels(map[string]string)                                {}
func (r *PodRecord) GetFinalizers() []string                                    { return nil }
func (r *PodRecord) SetFinalizers([]string)                                     {}
func (r *PodRecord) GetOwnerReferences() []metav1.OwnerReference                { return nil }
func (r *PodRecord) SetOwnerReferences([]metav1.OwnerReference)                 {}
func (r *PodRecord) GetManagedFields() []metav1.ManagedFieldsEntry              { return nil }
func (r *PodRecord) SetManagedFields(managedFields []metav1.ManagedFieldsEntry) {}
