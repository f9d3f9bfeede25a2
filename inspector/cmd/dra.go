package cmd

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// draRBAC is what the inspector needs to show DRA-mode nodes.
const draRBAC = "list on resourceslices and resourceclaims (resource.k8s.io) in all namespaces"

// readDRA lists our driver's ResourceSlices (only node's when node is set)
// and, when there are any, the ResourceClaims of every namespace: claims
// are listed whatever -n says, since node totals count every namespace. The
// DRA view is an addition: when either list fails (an API server without
// resource.k8s.io/v1, RBAC without the rules, anything else) both are
// dropped and err says why, so the device-plugin view still shows.
func readDRA(ctx context.Context, client kubernetes.Interface, node string) ([]resourceapi.ResourceSlice, []resourceapi.ResourceClaim, error) {
	selector := fields.OneTermEqualSelector("spec.driver", gpushare.DRADriverName)
	if node != "" {
		selector = fields.AndSelectors(selector, fields.OneTermEqualSelector("spec.nodeName", node))
	}
	slices, err := listSlices(ctx, client, selector)
	if err != nil {
		return nil, nil, draError("list resourceslices", err)
	}
	if len(slices) == 0 {
		// No DRA node: a cluster of device-plugin nodes costs no claim LIST.
		return nil, nil, nil
	}
	claims, err := listClaims(ctx, client)
	if err != nil {
		return nil, nil, draError("list resourceclaims", err)
	}
	return slices, claims, nil
}

// draError says why DRA-mode nodes cannot be shown and what would help.
func draError(what string, err error) error {
	switch {
	case apierrors.IsNotFound(err) || meta.IsNoMatchError(err):
		return fmt.Errorf("%s: %w (the API server does not serve resource.k8s.io/v1; Kubernetes 1.34 and later do)", what, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %w (showing DRA-mode nodes needs %s)", what, err, draRBAC)
	}
	return fmt.Errorf("%s: %w", what, err)
}
