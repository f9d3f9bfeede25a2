package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpushare/gpushare/plugin/gpushare"
)

// KubeletSocket is the kubelet's registration socket file name in the device-plugin directory.
const KubeletSocket = "kubelet.sock"

// DefaultStartTimeout bounds how long Start waits for its own socket to answer.
const DefaultStartTimeout = 10 * time.Second

// DefaultRegisterTimeout bounds one Register call to the kubelet.
const DefaultRegisterTimeout = 10 * time.Second

// ErrStopped marks a Start on a server that was already stopped: build a new one.
var ErrStopped = errors.New("device plugin server stopped")

// Allocator answers the kubelet's Allocate calls. Errors that carry a gRPC
// status reach the kubelet as they are; others become codes.Internal.
type Allocator interface {
	// Allocate returns one container response per container request.
	Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error)
}

// Config is what a Server needs; Dir and Allocator are required.
type Config struct {
	Dir             string              // the kubelet's device-plugin directory, holding KubeletSocket
	Endpoint        string              // our socket's file name in Dir; default gpushare.DevicePluginSocket
	ResourceName    string              // the resource registered; default gpushare.ResourceName
	Allocator       Allocator           // answers Allocate
	Devices         []*pluginapi.Device // the first device list
	Logger          *zap.Logger         // nil logs nothing
	StartTimeout    time.Duration       // 0 means DefaultStartTimeout
	RegisterTimeout time.Duration       // 0 means DefaultRegisterTimeout
}

// Server is one run of the device plugin's gRPC server. After Stop it cannot
// be started again; the manager builds a new one for each restart.
type Server struct {
	pluginapi.UnimplementedDevicePluginServer

	cfg    Config
	log    *zap.Logger
	socket string

	mu      sync.Mutex
	devices []*pluginapi.Device
	changed chan struct{} // closed and replaced on every SetDevices
	grpc    *grpc.Server
	sockID  os.FileInfo // our socket file, so Stop never removes a successor's
	started bool

	stopOnce sync.Once
	stopped  chan struct{} // closed by Stop; ends ListAndWatch streams
	done     chan struct{} // closed when Serve returns
}

// New checks cfg and builds a Server; nothing listens until Start.
func New(cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("device plugin server: no device-plugin directory")
	}
	if cfg.Allocator == nil {
		return nil, errors.New("device plugin server: no allocator")
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = gpushare.DevicePluginSocket
	}
	if cfg.ResourceName == "" {
		cfg.ResourceName = string(gpushare.ResourceName)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.RegisterTimeout <= 0 {
		cfg.RegisterTimeout = DefaultRegisterTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	return &Server{
		cfg:     cfg,
		log:     log.With(zap.String("socket", filepath.Join(cfg.Dir, cfg.Endpoint))),
		socket:  filepath.Join(cfg.Dir, cfg.Endpoint),
		devices: slices.Clone(cfg.Devices),
		changed: make(chan struct{}),
		stopped: make(chan struct{}),
		done:    make(chan struct{}),
	}, nil
}

// SocketPath returns the path of the plugin's socket.
func (s *Server) SocketPath() string { return s.socket }

// Done is closed when the server stops serving, whether by Stop or failure.
func (s *Server) Done() <-chan struct{} { return s.done }

// Start listens on the socket (replacing a stale file left by an earlier
// run), serves, and returns once a gRPC call over the socket answers, or
// fails and cleans up.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	select {
	case <-s.stopped:
		s.mu.Unlock()
		return ErrStopped
	default:
	}
	if s.started {
		s.mu.Unlock()
		return errors.New("device plugin server: already started")
	}
	s.started = true
	if err := os.Remove(s.socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.mu.Unlock()
		close(s.done)
		return fmt.Errorf("remove stale socket %s: %w", s.socket, err)
	}
	l, err := net.Listen("unix", s.socket)
	if err != nil {
		s.mu.Unlock()
		close(s.done)
		return fmt.Errorf("listen on %s: %w", s.socket, err)
	}
	// Closing a unix listener unlinks its path by default, which after a
	// kubelet restart may already be a successor's socket; Stop removes ours
	// only after checking it is still ours.
	if ul, ok := l.(*net.UnixListener); ok {
		ul.SetUnlinkOnClose(false)
	}
	s.sockID, _ = os.Stat(s.socket)
	s.grpc = grpc.NewServer(grpc.UnaryInterceptor(recoverUnary(s.log)), grpc.StreamInterceptor(recoverStream(s.log)))
	pluginapi.RegisterDevicePluginServer(s.grpc, s)
	srv := s.grpc
	s.mu.Unlock()

	go func() {
		defer close(s.done)
		if err := srv.Serve(l); err != nil {
			s.log.Error("device plugin server stopped serving", zap.Error(err))
		}
	}()
	if err := s.waitServing(ctx); err != nil {
		s.Stop()
		return err
	}
	s.log.Info("device plugin server serving")
	return nil
}

// waitServing polls the socket with a real call until it answers.
func (s *Server) waitServing(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	conn, err := dial(s.socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	for {
		// WaitForReady makes each call wait for the connection instead of failing fast.
		_, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("device plugin socket %s does not answer: %w", s.socket, err)
		case <-s.done:
			return fmt.Errorf("device plugin server on %s stopped while starting", s.socket)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// dial opens a gRPC client connection to a unix socket path.
func dial(path string) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", path, err)
	}
	return conn, nil
}

// Register tells the kubelet at Dir/kubelet.sock about our socket and resource.
func (s *Server) Register(ctx context.Context) error {
	kubelet := filepath.Join(s.cfg.Dir, KubeletSocket)
	conn, err := dial(kubelet)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RegisterTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     s.cfg.Endpoint,
		ResourceName: s.cfg.ResourceName,
		Options:      &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		return fmt.Errorf("register %s with the kubelet at %s: %w", s.cfg.ResourceName, kubelet, err)
	}
	s.log.Info("registered with the kubelet", zap.String("resource", s.cfg.ResourceName))
	return nil
}

// Stop ends every stream, stops serving and removes our socket; repeated
// calls, and calls on a server never started, are no-ops.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		close(s.stopped)
		s.mu.Lock()
		srv, id := s.grpc, s.sockID
		s.mu.Unlock()
		if srv == nil {
			return
		}
		// Streams end on s.stopped, so GracefulStop only waits for Allocate calls in flight.
		finished := make(chan struct{})
		go func() { srv.GracefulStop(); close(finished) }()
		select {
		case <-finished:
		case <-time.After(5 * time.Second):
			srv.Stop()
		}
		if cur, err := os.Stat(s.socket); err == nil && id != nil && os.SameFile(cur, id) {
			if err := os.Remove(s.socket); err != nil {
				s.log.Warn("remove socket", zap.Error(err))
			}
		}
		s.log.Info("device plugin server stopped")
	})
}

// SetDevices replaces the device list and pushes it to every ListAndWatch stream.
func (s *Server) SetDevices(devices []*pluginapi.Device) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.devices = slices.Clone(devices)
	close(s.changed)
	s.changed = make(chan struct{})
}

// current returns the device list and the channel closed on its next change.
func (s *Server) current() ([]*pluginapi.Device, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.devices, s.changed
}

// GetDevicePluginOptions implements pluginapi.DevicePluginServer: we need
// neither PreStartContainer nor preferred allocations, since the device IDs
// the kubelet picks do not decide the GPU.
func (s *Server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch implements pluginapi.DevicePluginServer: it sends the device
// list now and after every change until the kubelet leaves or Stop.
func (s *Server) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		devices, changed := s.current()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return fmt.Errorf("send device list: %w", err)
		}
		s.log.Debug("sent device list", zap.Int("devices", len(devices)))
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		case <-s.stopped:
			return nil
		}
	}
}

// Allocate implements pluginapi.DevicePluginServer by delegating to the Allocator.
func (s *Server) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp, err := s.cfg.Allocator.Allocate(ctx, req)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	if resp == nil || len(resp.ContainerResponses) != len(req.GetContainerRequests()) {
		// Never let the kubelet start a container with a missing answer.
		return nil, status.Errorf(codes.Internal, "gpushare: allocator answered %d containers for %d requests",
			len(resp.GetContainerResponses()), len(req.GetContainerRequests()))
	}
	return resp, nil
}

// GetPreferredAllocation implements pluginapi.DevicePluginServer; it is never
// advertised, so it only answers with no preference.
func (s *Server) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

// PreStartContainer implements pluginapi.DevicePluginServer; it is never
// advertised and has nothing to do.
func (s *Server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// recoverUnary turns a panic in a handler into codes.Internal, so a bug
// fails one call instead of taking every pod's allocations down.
func recoverUnary(log *zap.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in device plugin call", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.Stack("stack"))
				err = status.Errorf(codes.Internal, "gpushare: internal error in %s", info.FullMethod)
			}
		}()
		return handler(ctx, req)
	}
}

// recoverStream is recoverUnary for streams.
func recoverStream(log *zap.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error("panic in device plugin stream", zap.String("method", info.FullMethod), zap.Any("panic", r), zap.Stack("stack"))
				err = status.Errorf(codes.Internal, "gpushare: internal error in %s", info.FullMethod)
			}
		}()
		return handler(srv, ss)
	}
}
