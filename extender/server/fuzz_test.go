package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/gpushare/gpushare/extender/allocator"
	"github.com/gpushare/gpushare/extender/binder"
	"github.com/gpushare/gpushare/extender/cache"
	"github.com/gpushare/gpushare/plugin/gpushare"
)

// fuzzMaxBody is the fuzz server's filter and prioritize body limit, small so
// that inputs can cross it.
const fuzzMaxBody = 64 << 10

// fuzzEnv is one synced cache and server that every input of a fuzz target
// shares: a cache per input would spend the run starting informers.
type fuzzEnv struct {
	client *fake.Clientset
	cache  *cache.Cache
	h      http.Handler
	seq    atomic.Int64 // names the pods FuzzBind creates
}

// fuzzObjects is the cluster of the fuzz targets: two equal GPUs with a
// running pod, a mixed node with an unhealthy GPU and a pod not yet allocated
// (so the hold-back rule applies), a node without GPUs, the largest node
// the limits allow, and a node of every isolation tier (one fallen back, one
// unhealthy) with a pod not yet allocated that asks for a compute share.
func fuzzObjects(tb testing.TB) []runtime.Object {
	tb.Helper()
	mixed := gpuNode("mixed", 200, 3)
	desc, err := gpushare.EncodeNodeGPUs(gpushare.NodeGPUs{Unit: gpushare.GiB, GPUs: []gpushare.GPUInfo{
		{Index: 0, UUID: "GPU-0", Units: 80, Healthy: true},
		{Index: 1, UUID: "GPU-1", Units: 40, Healthy: true},
		{Index: 2, UUID: "GPU-2", Units: 80, Reason: "Xid 79"},
	}})
	if err != nil {
		tb.Fatal(err)
	}
	mixed.Annotations = map[string]string{gpushare.AnnotationNodeGPUs: desc}
	placed := func(p *corev1.Pod, node string, a gpushare.PodAssignment) *corev1.Pod {
		ann, err := a.Encode()
		if err != nil {
			tb.Fatal(err)
		}
		p.Spec.NodeName, p.Annotations = node, ann
		return p
	}
	tiers := tieredNode(tb, "tiers", 40, []gpushare.Isolation{gpushare.IsolationMPS, gpushare.IsolationHAMiCore, gpushare.IsolationNone, gpushare.IsolationMPS},
		"", "", "MPS control daemon not answering")
	tiers.Annotations[gpushare.AnnotationNodeGPUs] = strings.Replace(tiers.Annotations[gpushare.AnnotationNodeGPUs], `"index":3,"uuid":"GPU-3","model":"","units":40,"healthy":true`,
		`"index":3,"uuid":"GPU-3","model":"","units":40,"healthy":false`, 1)
	shared := placed(gpuPod("shared", 6), "tiers", gpushare.PodAssignment{GPUIndex: 0, PodUnits: 6, DevUnits: 40, AssumeTime: 3})
	shared.Annotations[gpushare.AnnotationComputePercent] = "30"
	return []runtime.Object{
		gpuNode("n1", 32, 2), mixed, gpuNode("cpu", 0, 0),
		gpuNode("huge", int64(gpushare.MaxUnits)*gpushare.MaxGPUsPerNode, gpushare.MaxGPUsPerNode),
		placed(gpuPod("running", 4), "n1", gpushare.PodAssignment{GPUIndex: 1, PodUnits: 4, DevUnits: 16, Assigned: true, AssumeTime: 1}),
		placed(gpuPod("inflight", 8), "mixed", gpushare.PodAssignment{GPUIndex: 1, PodUnits: 8, DevUnits: 40, AssumeTime: 2}),
		tiers, shared,
	}
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	f.Helper()
	e := &fuzzEnv{client: fake.NewClientset(fuzzObjects(f)...)}
	e.client.PrependReactor("create", "pods", bindReactor(e.client))
	// A long TTL keeps the cache's expiry tick out of the run: coverage from a
	// background tick makes inputs look new at random, and the fuzzer then
	// spends its time minimizing them.
	c, err := cache.New(cache.Config{Client: e.client, Logger: zap.NewNop(), AssumeTTL: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	runCache(f, c, 10*time.Second)
	s, err := New(Config{Cache: c, Binder: binder.New(binder.Config{Client: e.client, Cache: c}),
		Registry: prometheus.NewRegistry(), MaxBodyBytes: fuzzMaxBody})
	if err != nil {
		f.Fatal(err)
	}
	e.cache, e.h = c, s.Handler()
	return e
}

// serve calls the handler in process (no sockets, so inputs run fast) and
// fails an input it cannot answer within fuzzSlow: the fuzzer has no time
// limit of its own, and a hung input would stall it silently.
func (e *fuzzEnv) serve(t *testing.T, method, verb string, body []byte) (int, []byte) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, gpushare.ExtenderURLPrefix+"/"+verb, bytes.NewReader(body))
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.h.ServeHTTP(rec, req)
	}()
	timer := time.NewTimer(fuzzSlow)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("%s %s of %d bytes did not answer within %v", method, verb, len(body), fuzzSlow)
	}
	return rec.Code, rec.Body.Bytes()
}

// fuzzSlow bounds one request; the slowest take milliseconds.
const fuzzSlow = 10 * time.Second

// hugeNegativeExponent matches a number with a negative decimal exponent of
// five digits or more.
var hugeNegativeExponent = regexp.MustCompile(`[0-9.][eE]-0*[1-9][0-9]{4,}`)

// skipUnparsable skips quantities this harness cannot turn into a pod:
// apimachinery's ParseQuantity does not finish on 1e-999999999 (upstream),
// and the API server refuses to store such a pod, so no bind ever names one.
// Request bodies holding them are not skipped: the server refuses those.
func skipUnparsable(t *testing.T, parts ...[]byte) {
	t.Helper()
	for _, p := range parts {
		if hugeNegativeExponent.Match(p) {
			t.Skip("ParseQuantity does not finish on this quantity (upstream)")
		}
	}
}

// strictJSON decodes exactly one JSON value of type v's, with no unknown
// field and nothing but white space after it.
func strictJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("data after the JSON value: %v", err)
	}
	return nil
}

// wantError checks a 4xx answer: a JSON {"Error": ...} starting with prefix.
func wantError(t *testing.T, verb string, code int, out []byte, prefix string) {
	t.Helper()
	var e errorBody
	if err := strictJSON(out, &e); err != nil || !strings.HasPrefix(e.Error, prefix) {
		t.Fatalf("%s answered %d %q (%v); want an error starting with %q", verb, code, out, err, prefix)
	}
}

// inspect reads the cache through GET inspect and checks its bookkeeping: no
// GPU charged beyond its size, and every total the sum of its parts.
func (e *fuzzEnv) inspect(t *testing.T) cache.Inspect {
	t.Helper()
	code, out := e.serve(t, "GET", "inspect", nil)
	var in cache.Inspect
	if err := strictJSON(out, &in); code != http.StatusOK || err != nil {
		t.Fatalf("inspect answered %d %q: %v", code, out, err)
	}
	for _, n := range in.Nodes {
		var total, used uint64
		for _, d := range n.Devs {
			var pods uint64
			for _, p := range d.Pods {
				pods += p.UsedGPU
			}
			if d.UsedGPU > d.TotalGPU || pods != d.UsedGPU {
				t.Fatalf("node %s GPU %d: %d of %d units used, its pods hold %d", n.Name, d.ID, d.UsedGPU, d.TotalGPU, pods)
			}
			total += d.TotalGPU
			used += d.UsedGPU
		}
		if total != n.TotalGPU || used != n.UsedGPU {
			t.Fatalf("node %s totals %d/%d, its GPUs sum to %d/%d", n.Name, n.UsedGPU, n.TotalGPU, used, total)
		}
	}
	return in
}

// usedUnits sums the units charged on every node.
func usedUnits(in cache.Inspect) uint64 {
	var u uint64
	for _, n := range in.Nodes {
		u += n.UsedGPU
	}
	return u
}

// chargedOn returns the nodes on which namespace/name holds units.
func chargedOn(in cache.Inspect, namespace, name string) []string {
	var out []string
	for _, n := range in.Nodes {
		for _, d := range n.Devs {
			if slices.ContainsFunc(d.Pods, func(p cache.InspectPod) bool { return p.Namespace == namespace && p.Name == name }) {
				out = append(out, n.Name)
				break
			}
		}
	}
	return out
}

// expectArgs decides from the code what filter and prioritize must answer for
// body: the status, and for 4xx the error's prefix; on 200 it returns the
// arguments and the candidate node names.
func expectArgs(body []byte) (code int, prefix string, args extenderv1.ExtenderArgs, names []string) {
	// The reference: encoding/json on the upstream type, the whole body one value.
	if err := json.Unmarshal(body, &args); err != nil {
		return http.StatusBadRequest, "malformed request body: ", args, nil
	}
	switch {
	case args.Pod == nil:
		return http.StatusBadRequest, "request has no Pod", args, nil
	case args.NodeNames != nil:
		names = *args.NodeNames
	case args.Nodes != nil:
		for _, n := range args.Nodes.Items {
			names = append(names, n.Name)
		}
	default:
		return http.StatusBadRequest, "request has neither NodeNames nor Nodes", args, nil
	}
	return http.StatusOK, "", args, names
}

// checkStatus checks code against what expectArgs wants; a 413 is right only
// for a body over the limit, and then whatever else expectArgs says may also
// be right (the decoder may finish before reaching the limit). It reports
// whether the answer is a 200 to check further.
func checkStatus(t *testing.T, verb string, body []byte, limit, code int, out []byte, want int, prefix string) bool {
	t.Helper()
	if code == http.StatusRequestEntityTooLarge && len(body) > limit {
		wantError(t, verb, code, out, "request body larger than")
		return false
	}
	if code != want {
		t.Fatalf("%s of %d bytes answered %d %q; want %d %s", verb, len(body), code, clipFuzz(out), want, prefix)
	}
	if code != http.StatusOK {
		wantError(t, verb, code, out, prefix)
		return false
	}
	return true
}

func clipFuzz(b []byte) string {
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

// offers reports, by the contract's functions on the tier's published name,
// whether GPU i of n may run a pod asking iso: healthy, offering its tier,
// and able to limit its share.
func offers(n *allocator.Node, i int, iso allocator.PodIsolation) bool {
	tier := gpushare.Isolation(n.TierAt(i).String())
	return n.GPUs[i].Healthy && tier.Offers(iso.Tier()) && (iso.ComputePercent() == 0 || tier.Limits())
}

// room returns the free units of the GPUs of n that may run a pod asking
// iso, together, and the size of the largest of them.
func room(n *allocator.Node, iso allocator.PodIsolation) (free, largest uint64) {
	for i, g := range n.GPUs {
		if offers(n, i, iso) {
			free += g.Free()
			largest = max(largest, g.Units)
		}
	}
	return free, largest
}

// checkSignatures checks rule 2's invariant on a node: any two in-flight
// containers of one size in different pods share GPUs, pod total and
// isolation annotations, so the device plugin's answer is right whichever of
// them a call is for. (Within a pod the kubelet allocates in spec order, so
// a split pod's equal containers may sit on different GPUs.)
func checkSignatures(t *testing.T, n *allocator.Node) {
	t.Helper()
	type signature struct {
		gpus     gpushare.GPUSet
		podUnits uint64
		iso      allocator.PodIsolation
	}
	for i, a := range n.InFlight {
		for _, b := range n.InFlight[i+1:] {
			for _, sa := range a.Slots {
				for _, sb := range b.Slots {
					x, y := signature{sa.GPUs, a.PodUnits, a.Isolation}, signature{sb.GPUs, b.PodUnits, b.Isolation}
					if sa.Units == sb.Units && x != y {
						t.Fatalf("node %s: in-flight %d-unit containers of %s %+v and %s %+v", n.Name, sa.Units, a.Pod, x, b.Pod, y)
					}
				}
			}
		}
	}
}

// FuzzFilter posts arbitrary bodies to filter. A body that does not decode,
// or lacks the pod or the candidates, is a 400 (413 over the limit) with a
// JSON error; anything else is a 200 with an ExtenderFilterResult of the
// request's form that judges each candidate once, passes the others in the
// order sent, and fails with the reasons the code gives: the request's error
// for an invalid pod, unknown and GPU-less nodes, never a node without room.
func FuzzFilter(f *testing.F) {
	names := func(n ...string) *[]string { return &n }
	for _, a := range []extenderv1.ExtenderArgs{
		{Pod: gpuPod("p", 4), NodeNames: names("n1", "mixed", "cpu", "ghost")},
		{Pod: gpuPod("split", 30, 30), NodeNames: names("n1", "mixed", "huge")},
		{Pod: gpuPod("p", 8), Nodes: &corev1.NodeList{Items: []corev1.Node{*gpuNode("n1", 32, 2), *gpuNode("mixed", 200, 3)}}},
		// Isolation: a tier some GPUs offer, a share, a share beside the in-flight one, unreadable values.
		{Pod: isolated(gpuPod("p", 4), "mps", ""), NodeNames: names("tiers", "n1", "mixed")},
		{Pod: isolated(gpuPod("p", 6), "", "50"), NodeNames: names("tiers", "n1")},
		{Pod: isolated(gpuPod("p", 6), "", "30"), NodeNames: names("tiers")},
		{Pod: isolated(gpuPod("p", 30, 30), "hami-core", "10"), NodeNames: names("tiers")},
		{Pod: isolated(gpuPod("p", 4), "none", "10"), NodeNames: names("tiers", "n1")},
		{Pod: isolated(gpuPod("p", 4), "MPS", "1e2"), NodeNames: names("tiers")},
	} {
		body, err := json.Marshal(a)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(body)
	}
	// Over the body limit, built here so no corpus file has to hold it.
	f.Add([]byte(`{"Pod":{},"NodeNames":["` + strings.Repeat("n", fuzzMaxBody) + `"]}`))
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		code, out := e.serve(t, "POST", "filter", body)
		if refusedExponent(t, "filter", body, code, out) {
			return
		}
		want, prefix, args, names := expectArgs(body)
		if !checkStatus(t, "filter", body, fuzzMaxBody, code, out, want, prefix) {
			return
		}
		var res extenderv1.ExtenderFilterResult
		if err := strictJSON(out, &res); err != nil {
			t.Fatalf("filter answer %q is not an ExtenderFilterResult: %v", clipFuzz(out), err)
		}
		if res.Error != "" {
			t.Fatalf("filter answered 200 with Error %q", res.Error)
		}
		failed := func(n string) (string, bool) {
			if r, ok := res.FailedAndUnresolvableNodes[n]; ok {
				return r, true
			}
			r, ok := res.FailedNodes[n]
			return r, ok
		}
		// Every candidate is judged once: passing, or failed with a reason.
		var passing []string
		for _, n := range names {
			if _, ok := failed(n); !ok {
				passing = append(passing, n)
			}
		}
		// A set, so that large candidate lists stay cheap to check (and to minimize).
		candidate := make(map[string]bool, len(names))
		for _, n := range names {
			candidate[n] = true
		}
		for n := range res.FailedNodes {
			if _, both := res.FailedAndUnresolvableNodes[n]; both || !candidate[n] {
				t.Fatalf("FailedNodes names %q, which is no candidate or is also unresolvable", n)
			}
		}
		for n := range res.FailedAndUnresolvableNodes {
			if !candidate[n] {
				t.Fatalf("FailedAndUnresolvableNodes names %q, which is no candidate", n)
			}
		}
		// The answer has the form of the request, and passes exactly the others, in order.
		var got []string
		if args.NodeNames != nil {
			if res.NodeNames == nil || res.Nodes != nil {
				t.Fatalf("names request answered with NodeNames %v and Nodes %v", res.NodeNames, res.Nodes)
			}
			got = *res.NodeNames
		} else {
			if res.Nodes == nil || res.NodeNames != nil {
				t.Fatalf("nodes request answered with NodeNames %v and Nodes %v", res.NodeNames, res.Nodes)
			}
			sent := args.Nodes.Items
			for _, n := range res.Nodes.Items {
				// A passing node comes back as it was sent, in the order sent.
				for len(sent) > 0 && sent[0].Name != n.Name {
					sent = sent[1:]
				}
				if len(sent) == 0 {
					t.Fatalf("answer holds node %q, not sent or out of order", n.Name)
				}
				a, _ := json.Marshal(sent[0])
				b, _ := json.Marshal(n)
				if !bytes.Equal(a, b) {
					t.Fatalf("node %q came back changed:\n%s\n%s", n.Name, a, b)
				}
				sent = sent[1:]
				got = append(got, n.Name)
			}
		}
		if !slices.Equal(got, passing) {
			t.Fatalf("passing nodes %q; want the candidates without a failure, %q", got, passing)
		}
		req, rerr := allocator.NewRequest(args.Pod)
		for _, n := range names {
			reason, isFailed := failed(n)
			if isFailed && reason == "" {
				t.Fatalf("node %q failed without a reason", n)
			}
			switch view, known := e.cache.Node(n); {
			case rerr != nil:
				// An invalid request, or unreadable isolation annotations, fail
				// every node, unresolvably, saying why.
				invalid := errors.Is(rerr, gpushare.ErrInvalidRequest) || errors.Is(rerr, gpushare.ErrInvalidIsolation)
				if !invalid || res.FailedAndUnresolvableNodes[n] != rerr.Error() {
					t.Fatalf("invalid request (%v): node %q has reason %q", rerr, n, reason)
				}
			case req.Units == 0 && known && len(view.GPUs) > 0:
				if isFailed {
					t.Fatalf("a pod without gpu-mem failed GPU node %q: %s", n, reason)
				}
			case req.Units == 0 && known:
				// Bind refuses nodes without GPUs: filter fails them first.
				if want := allocator.NotGPUShareReason(n); res.FailedAndUnresolvableNodes[n] != want {
					t.Fatalf("pod without gpu-mem, node %q without GPUs: reason %q, want %q unresolvable", n, reason, want)
				}
			case !known:
				if want := "node " + n + " is not in the gpushare extender's cache"; res.FailedNodes[n] != want {
					t.Fatalf("unknown node %q: reason %q, want %q in FailedNodes", n, reason, want)
				}
			case !view.GPUShare:
				if want := allocator.NotGPUShareReason(n); res.FailedAndUnresolvableNodes[n] != want {
					t.Fatalf("node %q without GPUs: reason %q, want %q unresolvable", n, reason, want)
				}
			case !isFailed:
				free, largest := room(view, req.Isolation)
				for _, c := range req.Containers {
					if c.Units > largest || req.Units > free {
						t.Fatalf("node %q passed a %d-unit pod (container %s: %d, %v) with %d free units and GPUs of at most %d that may run it",
							n, req.Units, c.Name, c.Units, req.Isolation, free, largest)
					}
				}
			case strings.HasPrefix(reason, "no GPU offers isolation"):
				// The reason must be true: no healthy GPU offers the tier.
				offered := false
				for i, g := range view.GPUs {
					offered = offered || g.Healthy && gpushare.Isolation(view.TierAt(i).String()).Offers(req.Isolation.Tier())
				}
				if offered {
					t.Fatalf("node %q failed with %q, yet a healthy GPU offers %q", n, reason, req.Isolation.Tier())
				}
			}
		}
	})
}

// FuzzPrioritize posts arbitrary bodies to prioritize and to filter: both
// answer the same status, and a 200 scores every candidate in order within
// [0, 100], zero for a pod that is not ours and for every node filter fails.
func FuzzPrioritize(f *testing.F) {
	for _, s := range []string{
		`{"Pod":{"metadata":{"name":"p","namespace":"default"},"spec":{"containers":[{"name":"c","resources":{"limits":{"aliyun.com/gpu-mem":"4"}}}]}},"NodeNames":["n1","mixed","huge","cpu","ghost"]}`,
		`{"Pod":{"spec":{"containers":[{"name":"c","resources":{"limits":{"aliyun.com/gpu-mem":"-1"}}}]}},"NodeNames":["n1"]}`,
		`{"Pod":{"spec":{"containers":[{"name":"c"}]}},"Nodes":{"items":[{"metadata":{"name":"n1"}}]}}`,
		`{"Pod":{"metadata":{"name":"p","namespace":"default","annotations":{"gpushare.io/isolation":"mps","gpushare.io/compute-percent":"30"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"aliyun.com/gpu-mem":"6"}}}]}},"NodeNames":["tiers","n1","mixed"]}`,
		`{"Pod":{"metadata":{"name":"p","namespace":"default","annotations":{"gpushare.io/compute-percent":"101"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"aliyun.com/gpu-mem":"6"}}}]}},"NodeNames":["tiers"]}`,
		`{"Pod":{"metadata":{"name":"p","namespace":"default","annotations":{"gpushare.io/isolation":"none"}},"spec":{"containers":[{"name":"c","resources":{"limits":{"aliyun.com/gpu-mem":"4"}}}]}},"NodeNames":["tiers","n1"]}`,
	} {
		f.Add([]byte(s))
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		code, out := e.serve(t, "POST", "prioritize", body)
		if refusedExponent(t, "prioritize", body, code, out) {
			return
		}
		want, prefix, args, names := expectArgs(body)
		// Both verbs read their arguments alike, so they agree on the status.
		fcode, fout := e.serve(t, "POST", "filter", body)
		if fcode != code {
			t.Fatalf("prioritize answered %d, filter %d %q", code, fcode, clipFuzz(fout))
		}
		if !checkStatus(t, "prioritize", body, fuzzMaxBody, code, out, want, prefix) {
			return
		}
		var res extenderv1.HostPriorityList
		if err := strictJSON(out, &res); err != nil {
			t.Fatalf("prioritize answer %q is not a HostPriorityList: %v", clipFuzz(out), err)
		}
		var filtered extenderv1.ExtenderFilterResult
		if err := strictJSON(fout, &filtered); err != nil {
			t.Fatal(err)
		}
		if len(res) != len(names) {
			t.Fatalf("%d scores for %d candidates", len(res), len(names))
		}
		req, rerr := allocator.NewRequest(args.Pod)
		for i, h := range res {
			if h.Host != names[i] || h.Score < extenderv1.MinExtenderPriority || h.Score > extenderv1.MaxExtenderPriority {
				t.Fatalf("score %d is %+v for candidate %q; want that host, in [%d, %d]", i, h, names[i],
					extenderv1.MinExtenderPriority, extenderv1.MaxExtenderPriority)
			}
			_, failed := filtered.FailedNodes[h.Host]
			_, unresolvable := filtered.FailedAndUnresolvableNodes[h.Host]
			// A node the pod cannot go to, or a pod that is not ours, scores nothing.
			if (rerr != nil || req.Units == 0 || failed || unresolvable) && h.Score != extenderv1.MinExtenderPriority {
				t.Fatalf("node %q scores %d, though filter fails it (request error %v, %d units)", h.Host, h.Score, rerr, req.Units)
			}
		}
	})
}

// fuzzPod is the fresh pod of one FuzzBind input: containers c0 and c1 and an
// init container asking for the given gpu-mem quantities, each left out
// when empty or not a quantity (the API server would refuse the pod), and
// the annotations of ann when it is a JSON object of strings (a pending pod
// may carry assignment annotations written by hand or copied).
func fuzzPod(name, uid, ann, q0, q1, qinit string, sidecar bool) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(uid)}}
	var a map[string]string
	if json.Unmarshal([]byte(ann), &a) == nil {
		p.Annotations = a
	}
	ctr := func(name, q string) corev1.Container {
		c := corev1.Container{Name: name}
		if v, err := resource.ParseQuantity(q); err == nil {
			c.Resources.Limits = corev1.ResourceList{gpushare.ResourceName: v}
		}
		return c
	}
	p.Spec.Containers = []corev1.Container{ctr("c0", q0)}
	if q1 != "" {
		p.Spec.Containers = append(p.Spec.Containers, ctr("c1", q1))
	}
	if qinit != "" {
		init := ctr("init", qinit)
		if sidecar {
			always := corev1.ContainerRestartPolicyAlways
			init.RestartPolicy = &always
		}
		p.Spec.InitContainers = []corev1.Container{init}
	}
	return p
}

// FuzzBind posts a bind body in which "$POD" and "$UID" name a pod created
// for this input. A 200 leaves the pod bound there and charged there only; a
// refused bind (500, or 400 for a pod naming no gpu-mem or a node without
// GPUs in the cache) names the pod and adds no charge anywhere; no GPU is ever
// charged beyond its size. A bind that succeeded is posted again, as the
// scheduler's retry does, and must succeed again.
func FuzzBind(f *testing.F) {
	for _, s := range []struct {
		body, ann, q0, q1, qinit string
		sidecar                  bool
	}{
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"n1"}`, "", "4", "", "", false},
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"mixed"}`, "", "30", "30", "50", true},
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"ghost"}`, "", "1", "", "", false},
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"n1"}`,
			`{"ALIYUN_COM_GPU_MEM_IDX":"7","scheduler.framework.gpushare.allocation":"{\"0\":{\"5\":3}}"}`, "10", "10", "", false},
		{`{"PodName":"running","PodNamespace":"default","PodUID":"uid-running","Node":"n1"}`, "", "", "", "", false},
		// Hostile binds: the right name with another pod's UID, the right pod in another
		// namespace, a name and a node far longer than any the API allows.
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"uid-running","Node":"n1"}`, "", "4", "", "", false},
		{`{"PodName":"$POD","PodNamespace":"kube-system","PodUID":"$UID","Node":"n1"}`, "", "4", "", "", false},
		{`{"PodName":"` + strings.Repeat("p", 4096) + `","PodNamespace":"default","PodUID":"$UID","Node":"` + strings.Repeat("n", 4096) + `"}`, "", "4", "", "", false},
		// Isolation: the tier's GPU, the in-flight pod's size with another
		// share (held back) and with its own (beside it), a tier the node
		// lacks, unreadable values.
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"tiers"}`, `{"gpushare.io/isolation":"hami-core"}`, "4", "", "", false},
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"tiers"}`, `{"gpushare.io/compute-percent":"50"}`, "6", "", "", false},
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"tiers"}`, `{"gpushare.io/compute-percent":"30"}`, "6", "", "", false},
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"n1"}`, `{"gpushare.io/isolation":"mps"}`, "4", "", "", false},
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"tiers"}`, `{"gpushare.io/isolation":"mps","gpushare.io/compute-percent":"0"}`, "4", "", "", false},
		{`{"PodName":"$POD","PodNamespace":"default","PodUID":"$UID","Node":"tiers"}`, `{"gpushare.io/isolation":"mps"}`, "30", "30", "8", true},
	} {
		f.Add([]byte(s.body), s.ann, s.q0, s.q1, s.qinit, s.sidecar)
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte, ann, q0, q1, qinit string, sidecar bool) {
		skipUnparsable(t, []byte(q0), []byte(q1), []byte(qinit))
		ctx := context.Background()
		n := e.seq.Add(1)
		name, uid := fmt.Sprintf("fz-%d", n), fmt.Sprintf("fz-uid-%d", n)
		pod := fuzzPod(name, uid, ann, q0, q1, qinit, sidecar)
		if _, err := e.client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Deleted afterwards so that bound inputs do not fill the cluster.
		defer e.client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{})
		body = bytes.ReplaceAll(body, []byte("$POD"), []byte(name))
		body = bytes.ReplaceAll(body, []byte("$UID"), []byte(uid))
		// The scheduler retries a bind whose answer it did not get: the same
		// bind again must succeed, whether or not the informer has seen it.
		if first := e.checkBind(t, body); first == http.StatusOK {
			if again := e.checkBind(t, body); again != http.StatusOK {
				t.Fatalf("retry of a bind that succeeded answered %d", again)
			}
		}
	})
}

// checkBind posts body to bind and checks the answer against the cache and
// the API.
func (e *fuzzEnv) checkBind(t *testing.T, body []byte) int {
	t.Helper()
	before := e.inspect(t)
	code, out := e.serve(t, "POST", "bind", body)
	after := e.inspect(t)
	var args extenderv1.ExtenderBindingArgs
	want, prefix := 0, ""
	switch err := json.Unmarshal(body, &args); {
	case err != nil:
		want, prefix = http.StatusBadRequest, "malformed request body: "
	case args.PodName == "" || args.PodNamespace == "" || args.PodUID == "" || args.Node == "":
		want, prefix = http.StatusBadRequest, "bind request needs PodName, PodNamespace, PodUID and Node"
	}
	if code == http.StatusRequestEntityTooLarge && len(body) > maxBindBody {
		wantError(t, "bind", code, out, "request body larger than")
		return code
	}
	if want != 0 {
		if code != want {
			t.Fatalf("bind %q answered %d %q; want %d", clipFuzz(body), code, out, want)
		}
		wantError(t, "bind", code, out, prefix)
		return code
	}
	var res extenderv1.ExtenderBindingResult
	if err := strictJSON(out, &res); err != nil {
		t.Fatalf("bind answered %d %q, not an ExtenderBindingResult: %v", code, out, err)
	}
	key := args.PodNamespace + "/" + args.PodName
	got, getErr := e.client.CoreV1().Pods(args.PodNamespace).Get(context.Background(), args.PodName, metav1.GetOptions{})
	switch code {
	case http.StatusOK:
		if res.Error != "" {
			t.Fatalf("bind answered 200 with Error %q", res.Error)
		}
		// A bind that succeeded left the pod bound with its GPU, and charged.
		if getErr != nil || got.UID != args.PodUID || got.Spec.NodeName != args.Node {
			t.Fatalf("bind of %s (%s) to %s answered 200; the pod is %v (%v)", key, args.PodUID, args.Node, got, getErr)
		}
		want := []string{args.Node}
		if req, err := allocator.NewRequest(got); err != nil {
			t.Fatalf("pod %s with an invalid request (%v) bound", key, err)
		} else if req.Units == 0 {
			// Asking for no GPU memory, it is bound with no GPU and charged nowhere.
			want = nil
		} else if _, ok, err := gpushare.DecodePodAssignment(got.Annotations); !ok || err != nil {
			t.Fatalf("pod %s bound without a readable assignment: %v %v", key, got.Annotations, err)
		}
		if on := chargedOn(after, args.PodNamespace, args.PodName); !slices.Equal(on, want) {
			t.Fatalf("pod %s bound to %s is charged on %v", key, args.Node, on)
		}
		if want != nil {
			e.checkIsolation(t, got, args.Node)
		}
	case http.StatusInternalServerError, http.StatusBadRequest:
		// A refused bind says which pod, and adds nothing anywhere. A 400 is
		// a bind that is not the extender's to make: a pod naming no gpu-mem
		// or a node without GPUs in the cache; nothing was written.
		if code == http.StatusBadRequest {
			view, known := e.cache.Node(args.Node)
			ours := getErr == nil && got.UID == args.PodUID && cache.NamesGPUMem(got)
			if known && len(view.GPUs) > 0 && ours {
				t.Fatalf("bind of gpushare pod %s to GPU node %s refused with 400: %q", key, args.Node, res.Error)
			}
			if !strings.Contains(res.Error, "bind refused") {
				t.Fatalf("bind answered 400 with %q; want it to say the bind is refused", res.Error)
			}
			if getErr == nil && got.UID == args.PodUID && got.Spec.NodeName == args.Node {
				t.Fatalf("bind of %s to %s refused with 400 (%q), yet the pod is bound there", key, args.Node, res.Error)
			}
		}
		if !strings.Contains(res.Error, key) {
			t.Fatalf("bind refused with %q, which does not name pod %s", res.Error, key)
		}
		if usedUnits(after) > usedUnits(before) {
			t.Fatalf("refused bind of %s (%s) raised the charged units from %d to %d", key, res.Error, usedUnits(before), usedUnits(after))
		}
		if getErr == nil && got.UID == args.PodUID && got.Spec.NodeName == "" {
			if on := chargedOn(after, args.PodNamespace, args.PodName); len(on) > 0 {
				t.Fatalf("refused bind of unbound pod %s (%s) left it charged on %v", key, res.Error, on)
			}
		}
	default:
		t.Fatalf("bind %q answered %d %q; want 200, 400 or 500", clipFuzz(body), code, out)
	}
	return code
}

// checkIsolation checks a pod bound to node: every GPU it is charged on may
// run it by its isolation annotations, and the node's in-flight pods keep
// rule 2's invariant.
func (e *fuzzEnv) checkIsolation(t *testing.T, pod *corev1.Pod, node string) {
	t.Helper()
	req, err := allocator.NewRequest(pod)
	if err != nil {
		t.Fatal(err)
	}
	view, ok := e.cache.Node(node)
	if !ok {
		t.Fatalf("node %s of a bound pod is not in the cache", node)
	}
	in, _ := e.cache.Inspect(node)
	for _, d := range in.Nodes[0].Devs {
		if !slices.ContainsFunc(d.Pods, func(p cache.InspectPod) bool { return p.Namespace == pod.Namespace && p.Name == pod.Name }) {
			continue
		}
		for i, g := range view.GPUs {
			if g.Index == d.ID && !offers(view, i, req.Isolation) {
				t.Fatalf("pod %s/%s asking %v bound on GPU %d of tier %v (healthy %v)", pod.Namespace, pod.Name, req.Isolation, g.Index, view.TierAt(i), g.Healthy)
			}
		}
	}
	checkSignatures(t, view)
}

// refusedExponent checks the answer to a body holding a quantity with a
// four-digit exponent, which the server refuses before decoding (decoding it
// would not finish); it reports whether body was one.
func refusedExponent(t *testing.T, verb string, body []byte, code int, out []byte) bool {
	t.Helper()
	if len(body) > fuzzMaxBody {
		return false
	}
	if _, bad := findHugeExponent(body); !bad {
		return false
	}
	if code != http.StatusBadRequest || !bytes.Contains(out, []byte("exponent")) {
		t.Fatalf("%s %q answered %d %q; want 400 naming the exponent", verb, clipFuzz(body), code, out)
	}
	return true
}
