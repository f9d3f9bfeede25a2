//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// bedPlugin is the smallest honest device plugin: it serves fixed devices and records every
// Allocate, so the bed's tests can see the kubelet's device manager work without depending on the
// project's own plugin.
type bedPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	resource string
	devices  []string
	dir      string
	endpoint string

	mu        sync.Mutex
	allocated [][]string // device IDs per container request, in call order
	server    *grpc.Server
}

func newBedPlugin(dir, resource string, n int) *bedPlugin {
	p := &bedPlugin{resource: resource, dir: dir, endpoint: "bed.sock"}
	for i := range n {
		p.devices = append(p.devices, fmt.Sprintf("bed-dev-%02d", i))
	}
	return p
}

func (p *bedPlugin) socket() string { return filepath.Join(p.dir, p.endpoint) }

// start serves on the plugin socket and registers with the kubelet.
func (p *bedPlugin) start(t *testing.T) {
	t.Helper()
	_ = os.Remove(p.socket())
	l, err := net.Listen("unix", p.socket())
	if err != nil {
		t.Fatalf("listen %s: %v", p.socket(), err)
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go srv.Serve(l)
	p.mu.Lock()
	p.server = srv
	p.mu.Unlock()
	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient("unix://"+filepath.Join(p.dir, "kubelet.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial kubelet: %v", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: p.endpoint, ResourceName: p.resource,
	}); err != nil {
		t.Fatalf("register with kubelet: %v", err)
	}
}

func (p *bedPlugin) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.server != nil {
		p.server.Stop()
	}
}

func (p *bedPlugin) allocations() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]string(nil), p.allocated...)
}

func (p *bedPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *bedPlugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	resp := &pluginapi.ListAndWatchResponse{}
	for _, id := range p.devices {
		resp.Devices = append(resp.Devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	if err := stream.Send(resp); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (p *bedPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range req.ContainerRequests {
		ids := append([]string(nil), c.DevicesIds...)
		sort.Strings(ids)
		p.allocated = append(p.allocated, ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"BED_DEVICES": strings.Join(ids, ",")},
		})
	}
	return resp, nil
}
