package server_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/server"
)

// Behaviours of fuzzAllocator, chosen per input.
const (
	answerAll    = iota // one response per container request
	answerFewer         // one response short
	answerMore          // one response too many
	answerNil           // nil response, nil error
	answerError         // a plain error
	answerStatus        // a gRPC status error
	answerPanic         // a panic
	behaviours          // how many there are
)

// fuzzAllocator answers as the current input says and keeps what it was asked.
type fuzzAllocator struct {
	mu       sync.Mutex
	behave   int
	code     codes.Code
	msg      string
	seen     *pluginapi.AllocateRequest
	response *pluginapi.AllocateResponse
}

func (a *fuzzAllocator) set(behave int, code codes.Code, msg string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.behave, a.code, a.msg, a.seen, a.response = behave, code, msg, nil, nil
}

func (a *fuzzAllocator) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seen = req
	n := len(req.GetContainerRequests())
	switch a.behave {
	case answerFewer:
		n--
	case answerMore:
		n++
	case answerNil:
		return nil, nil
	case answerError:
		return nil, errors.New(a.msg)
	case answerStatus:
		return nil, status.Error(a.code, a.msg)
	case answerPanic:
		panic(a.msg)
	}
	resp := &pluginapi.AllocateResponse{}
	for i := range max(n, 0) {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"I": strconv.Itoa(i)},
		})
	}
	a.response = resp
	return resp, nil
}

// FuzzAllocate sends the kubelet's AllocateRequest (protobuf JSON) over the
// plugin's socket while the allocator misbehaves as the input says: the
// kubelet must get either exactly one answer per container, unchanged, or a
// gRPC error with a code and a message, never a short or padded answer, and
// a panic must not take the server down. The never-advertised calls take the
// same device IDs and must answer empty.
func FuzzAllocate(f *testing.F) {
	f.Add(`{"containerRequests":[{"devicesIds":["0-0","0-1"]},{"devicesIds":["1-7"]}]}`, uint8(answerAll), uint8(0), "")
	f.Add(`{"containerRequests":[{"devicesIds":["0-0"]}]}`, uint8(answerFewer), uint8(0), "")
	f.Add(`{}`, uint8(answerStatus), uint8(codes.FailedPrecondition), "gpushare: no pending pod matches this allocation")
	f.Add(`{"containerRequests":[{}]}`, uint8(answerPanic), uint8(0), "bug")
	alloc := &fuzzAllocator{}
	dir := f.TempDir()
	s, err := server.New(server.Config{Dir: dir, Allocator: alloc, Devices: devices("0-0", "0-1")})
	if err != nil {
		f.Fatal(err)
	}
	if err := s.Start(context.Background()); err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Stop)
	c := client(f, s.SocketPath())
	f.Fuzz(func(t *testing.T, reqJSON string, behave, code uint8, msg string) {
		var req pluginapi.AllocateRequest
		if protojson.Unmarshal([]byte(reqJSON), &req) != nil {
			return
		}
		// A deadline, so that a hung call fails the input instead of stalling the fuzzer.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		b, cd := int(behave)%behaviours, codes.Code(code%17)
		alloc.set(b, cd, msg)
		resp, err := c.Allocate(ctx, &req)
		alloc.mu.Lock()
		seen, sent := alloc.seen, alloc.response
		alloc.mu.Unlock()
		if !proto.Equal(seen, &req) {
			t.Fatalf("allocator got %v; the kubelet sent %v", seen, &req)
		}
		n := len(req.ContainerRequests)
		// The server's own message for a wrong count is a prefix; others are whole.
		wantCode, wantMsg, whole := codes.Internal, "gpushare: allocator answered ", false
		switch {
		case b == answerAll || (b == answerFewer && n == 0):
			wantCode = codes.OK
		case b == answerError:
			wantMsg, whole = msg, true
		case b == answerStatus && cd != codes.OK:
			// status.Error with OK is a nil error: a nil answer like answerNil.
			wantCode, wantMsg, whole = cd, msg, true
		case b == answerPanic:
			wantMsg, whole = "gpushare: internal error in /v1beta1.DevicePlugin/Allocate", true
		}
		st, _ := status.FromError(err)
		if st.Code() != wantCode {
			t.Fatalf("behaviour %d, %d requests: Allocate = %v, %v; want code %v", b, n, resp, err, wantCode)
		}
		if wantCode == codes.OK {
			if !proto.Equal(resp, sent) || len(resp.ContainerResponses) != n {
				t.Fatalf("kubelet got %v; the allocator answered %v for %d requests", resp, sent, n)
			}
		} else if got := st.Message(); resp != nil || (utf8.ValidString(msg) && (!strings.HasPrefix(got, wantMsg) || whole && got != wantMsg)) {
			// gRPC carries a message only as valid UTF-8; other bytes may come out replaced.
			t.Fatalf("behaviour %d: Allocate = %v, %q; want no answer and the message %q", b, resp, got, wantMsg)
		}

		var ids []string
		for _, r := range req.ContainerRequests {
			ids = append(ids, r.DevicesIds...)
		}
		pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: ids, MustIncludeDeviceIDs: ids[:len(ids)/2], AllocationSize: int32(code) - 8},
		}})
		if err != nil || len(pref.ContainerResponses) != 0 {
			t.Fatalf("GetPreferredAllocation = %v, %v; want an empty answer", pref, err)
		}
		pre, err := c.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: ids})
		if err != nil || !proto.Equal(pre, &pluginapi.PreStartContainerResponse{}) {
			t.Fatalf("PreStartContainer = %v, %v; want an empty answer", pre, err)
		}
	})
}
