package manager

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/inventory"
)

// publishNode writes the GPU count into the node's status capacity and
// allocatable (it is no device-plugin resource, so only a PATCH sets it) and
// the GPU description annotation. Both are idempotent, so transient errors
// are simply retried.
func publishNode(ctx context.Context, client kubernetes.Interface, node string, inv *inventory.Inventory, simulated bool) error {
	desc, err := gpushare.EncodeNodeGPUs(inv.NodeGPUs(simulated))
	if err != nil {
		return fmt.Errorf("encode the node GPU description: %w", err)
	}
	count := strconv.Itoa(len(inv.GPUs()))
	status, err := json.Marshal(map[string]any{"status": map[string]any{
		"capacity":    map[string]string{string(gpushare.ResourceCount): count},
		"allocatable": map[string]string{string(gpushare.ResourceCount): count},
	}})
	if err != nil {
		return err
	}
	meta, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{gpushare.AnnotationNodeGPUs: desc},
	}})
	if err != nil {
		return err
	}
	always := func(error) bool { return ctx.Err() == nil }
	if err := retry.OnError(retry.DefaultBackoff, always, func() error {
		_, err := client.CoreV1().Nodes().PatchStatus(ctx, node, status)
		return err
	}); err != nil {
		return fmt.Errorf("patch node %s status %s: %w", node, gpushare.ResourceCount, err)
	}
	if err := retry.OnError(retry.DefaultBackoff, always, func() error {
		_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, meta, metav1.PatchOptions{})
		return err
	}); err != nil {
		return fmt.Errorf("patch node %s annotation %s: %w", node, gpushare.AnnotationNodeGPUs, err)
	}
	return nil
}
