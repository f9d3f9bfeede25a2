package dra

import (
	"context"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// sliceCheckEvery is how often keepPublished looks for the node's slice
// (in its informer's store: no API call).
const sliceCheckEvery = 200 * time.Millisecond

// keepPublished calls resync when the node's ResourceSlice of this driver
// is deleted, and every sliceCheckEvery while it is missing, until ctx ends.
// A kubelet deletes every slice of its node when it starts (it cannot know
// which drivers will come back); the helper's controller would publish
// again only after its 30 s sync delay, leaving the node's GPUs
// unschedulable meanwhile. The check covers a deletion the helper's own
// informer had not seen yet when resync published: the helper then took
// the slice for present and wrote nothing.
func keepPublished(ctx context.Context, client kubernetes.Interface, node string, resync func()) error {
	f := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.Set{
			resourceapi.ResourceSliceSelectorNodeName: node,
			resourceapi.ResourceSliceSelectorDriver:   gpushare.DRADriverName,
		}.String()
	}))
	inf := f.Resource().V1().ResourceSlices().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(any) { resync() }}); err != nil {
		return err
	}
	f.Start(ctx.Done())
	defer f.Shutdown()
	t := time.NewTicker(sliceCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if inf.HasSynced() && len(inf.GetStore().ListKeys()) == 0 {
				resync()
			}
		}
	}
}
