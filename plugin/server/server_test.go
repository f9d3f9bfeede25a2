package server_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
	"github.com/gpushare/gpushare/plugin/server"
)

// fakeKubelet is the registration peer: the real kubelet comes in the e2e tests.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	mu   sync.Mutex
	reqs []*pluginapi.RegisterRequest
	got  chan struct{}
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	k.reqs = append(k.reqs, r)
	k.mu.Unlock()
	k.got <- struct{}{}
	return &pluginapi.Empty{}, nil
}

func startFakeKubelet(t testing.TB, dir string) *fakeKubelet {
	t.Helper()
	l, err := net.Listen("unix", filepath.Join(dir, server.KubeletSocket))
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{got: make(chan struct{}, 10)}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, k)
	go srv.Serve(l)
	t.Cleanup(srv.Stop)
	return k
}

// allocFunc adapts a function to server.Allocator.
type allocFunc func(context.Context, *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)

func (f allocFunc) Allocate(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	return f(ctx, r)
}

func echoAllocator() server.Allocator {
	return allocFunc(func(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		resp := &pluginapi.AllocateResponse{}
		for _, c := range r.ContainerRequests {
			resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
				Envs: map[string]string{"N": string(rune('0' + len(c.DevicesIds)))},
			})
		}
		return resp, nil
	})
}

func devices(ids ...string) []*pluginapi.Device {
	var out []*pluginapi.Device
	for _, id := range ids {
		out = append(out, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	return out
}

func newServer(t *testing.T, dir string, a server.Allocator) *server.Server {
	t.Helper()
	s, err := server.New(server.Config{Dir: dir, Allocator: a, Devices: devices("0-0", "0-1"), Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func client(t testing.TB, path string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func ids(resp *pluginapi.ListAndWatchResponse) []string {
	var out []string
	for _, d := range resp.Devices {
		out = append(out, d.ID+"/"+d.Health)
	}
	return out
}

func TestStartRegisterListAndWatchStop(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	kubelet := startFakeKubelet(t, dir)
	s := newServer(t, dir, echoAllocator())
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	if s.SocketPath() != filepath.Join(dir, gpushare.DevicePluginSocket) {
		t.Errorf("socket %s", s.SocketPath())
	}
	// Start returned: the socket must answer now, with no retry.
	c := client(t, s.SocketPath())
	opts, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || opts.PreStartRequired || opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions = %v, %v", opts, err)
	}

	if err := s.Register(ctx); err != nil {
		t.Fatal(err)
	}
	<-kubelet.got
	kubelet.mu.Lock()
	r := kubelet.reqs[0]
	kubelet.mu.Unlock()
	if r.Version != pluginapi.Version || r.Endpoint != gpushare.DevicePluginSocket || r.ResourceName != string(gpushare.ResourceName) {
		t.Errorf("RegisterRequest = %v", r)
	}

	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || len(first.Devices) != 2 {
		t.Fatalf("first list = %v, %v", first, err)
	}
	s.SetDevices([]*pluginapi.Device{{ID: "0-0", Health: pluginapi.Unhealthy}})
	second, err := stream.Recv()
	if err != nil || len(ids(second)) != 1 || ids(second)[0] != "0-0/Unhealthy" {
		t.Fatalf("second list = %v, %v", second, err)
	}
	// A stream opened later starts from the current list.
	late, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := late.Recv(); err != nil || len(got.Devices) != 1 {
		t.Fatalf("late stream first list = %v, %v", got, err)
	}

	s.Stop()
	if _, err := stream.Recv(); err == nil {
		t.Error("stream still open after Stop")
	}
	if _, err := os.Stat(s.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Stop: %v", err)
	}
	select {
	case <-s.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after Stop")
	}
	s.Stop() // idempotent
	if err := s.Start(ctx); !errors.Is(err, server.ErrStopped) {
		t.Errorf("Start after Stop = %v; want ErrStopped", err)
	}
}

func TestAllocateErrors(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	var mode string
	var mu sync.Mutex
	a := allocFunc(func(ctx context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
		mu.Lock()
		m := mode
		mu.Unlock()
		switch m {
		case "status":
			return nil, status.Error(codes.FailedPrecondition, "gpushare: no pod waits for 4 units")
		case "plain":
			return nil, errors.New("boom")
		case "panic":
			panic("bug")
		case "short":
			return &pluginapi.AllocateResponse{}, nil
		case "nil":
			return nil, nil
		}
		return echoAllocator().Allocate(ctx, r)
	})
	s := newServer(t, dir, a)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	c := client(t, s.SocketPath())
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0-0", "0-1"}}}}
	for _, tt := range []struct {
		mode string
		code codes.Code
		msg  string
	}{
		{"status", codes.FailedPrecondition, "gpushare: no pod waits for 4 units"},
		{"plain", codes.Internal, "boom"},
		{"panic", codes.Internal, "gpushare: internal error in /v1beta1.DevicePlugin/Allocate"},
		{"short", codes.Internal, "gpushare: allocator answered 0 containers for 1 requests"},
		{"nil", codes.Internal, "gpushare: allocator answered 0 containers for 1 requests"},
		{"ok", codes.OK, ""},
	} {
		mu.Lock()
		mode = tt.mode
		mu.Unlock()
		resp, err := c.Allocate(ctx, req)
		st, _ := status.FromError(err)
		if st.Code() != tt.code || st.Message() != tt.msg {
			t.Errorf("%s: Allocate = %v, %v; want %v %q", tt.mode, resp, err, tt.code, tt.msg)
		}
		if tt.code == codes.OK && (len(resp.ContainerResponses) != 1 || resp.ContainerResponses[0].Envs["N"] != "2") {
			t.Errorf("%s: response %v", tt.mode, resp)
		}
	}
}

// The kubelet wipes plugin sockets when it restarts; a stale file must not
// stop a new server, and the old server's Stop must not remove the new socket.
func TestRestartOverStaleSocket(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, gpushare.DevicePluginSocket), []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := newServer(t, dir, echoAllocator())
	if err := old.Start(ctx); err != nil {
		t.Fatalf("start over a stale file: %v", err)
	}
	if err := os.Remove(old.SocketPath()); err != nil { // what the kubelet does
		t.Fatal(err)
	}
	successor := newServer(t, dir, echoAllocator())
	if err := successor.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer successor.Stop()
	old.Stop()
	if _, err := client(t, successor.SocketPath()).GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		t.Errorf("successor does not answer after the old server stopped: %v", err)
	}
}

func TestFailures(t *testing.T) {
	ctx := t.Context()
	if _, err := server.New(server.Config{Allocator: echoAllocator()}); err == nil {
		t.Error("New without a directory succeeded")
	}
	if _, err := server.New(server.Config{Dir: t.TempDir()}); err == nil {
		t.Error("New without an allocator succeeded")
	}
	s := newServer(t, filepath.Join(t.TempDir(), "missing"), echoAllocator())
	if err := s.Start(ctx); err == nil {
		t.Error("Start in a missing directory succeeded")
	}
	s.Stop()

	never := newServer(t, t.TempDir(), echoAllocator())
	never.Stop() // never started: a no-op

	noKubelet := newServer(t, t.TempDir(), echoAllocator())
	if err := noKubelet.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer noKubelet.Stop()
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := noKubelet.Register(rctx); err == nil {
		t.Error("Register without a kubelet succeeded")
	}
	if err := noKubelet.Start(ctx); err == nil {
		t.Error("second Start succeeded")
	}
}

// ListAndWatch ends when the client goes away, not only on Stop.
func TestListAndWatchClientLeaves(t *testing.T) {
	dir := t.TempDir()
	s := newServer(t, dir, echoAllocator())
	if err := s.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	ctx, cancel := context.WithCancel(t.Context())
	stream, err := client(t, s.SocketPath()).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := stream.Recv(); err == nil || errors.Is(err, io.EOF) {
		t.Errorf("Recv after cancel = %v; want a cancellation error", err)
	}
	// Stop must not hang on the abandoned stream.
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop hangs")
	}
}
