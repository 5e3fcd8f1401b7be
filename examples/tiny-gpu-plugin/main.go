// tiny-gpu-plugin: a deliberately small Kubernetes device plugin for NVIDIA GPUs, written
// outside gpulab to show that gpulab tests any plugin through a subject file. It lists
// the GPUs NVML reports as resource example.com/gpu, hands their UUIDs to containers in
// TINY_GPU_UUIDS, and marks a GPU Unhealthy on any Xid it is told about (it has no list
// of harmless Xids and never marks a GPU Healthy again).
package main

import (
	"context"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	api "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	resource = "example.com/gpu"
	socket   = "tiny-gpu.sock"
	envVar   = "TINY_GPU_UUIDS"
)

type plugin struct {
	api.UnimplementedDevicePluginServer
	mu      sync.Mutex
	devices map[string]string // UUID -> health
	changed chan struct{}
}

func (p *plugin) list() []*api.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*api.Device, 0, len(p.devices))
	for id, health := range p.devices {
		out = append(out, &api.Device{ID: id, Health: health})
	}
	return out
}

func (p *plugin) GetDevicePluginOptions(context.Context, *api.Empty) (*api.DevicePluginOptions, error) {
	return &api.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *api.Empty, s api.DevicePlugin_ListAndWatchServer) error {
	for {
		devices := p.list()
		log.Printf("ListAndWatch: sending %d devices", len(devices))
		if err := s.Send(&api.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-p.changed:
		case <-s.Context().Done():
			return nil
		}
	}
}

func (p *plugin) Allocate(_ context.Context, req *api.AllocateRequest) (*api.AllocateResponse, error) {
	resp := &api.AllocateResponse{}
	for _, c := range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &api.ContainerAllocateResponse{
			Envs: map[string]string{envVar: strings.Join(c.DevicesIds, ",")},
		})
	}
	return resp, nil
}

func (p *plugin) markUnhealthy(uuid string) {
	p.mu.Lock()
	p.devices[uuid] = api.Unhealthy
	p.mu.Unlock()
	select {
	case p.changed <- struct{}{}:
	default:
	}
}

// watch marks a GPU Unhealthy on any critical Xid event for it.
func (p *plugin) watch(handles []nvml.Device) {
	set, ret := nvml.EventSetCreate()
	if ret != nvml.SUCCESS {
		log.Fatalf("EventSetCreate: %v", nvml.ErrorString(ret))
	}
	for _, d := range handles {
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			log.Fatalf("RegisterEvents: %v", nvml.ErrorString(ret))
		}
	}
	log.Printf("watching %d GPUs for Xid events", len(handles))
	for {
		e, ret := set.Wait(5000)
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret != nvml.SUCCESS {
			log.Printf("EventSetWait: %v", nvml.ErrorString(ret))
			time.Sleep(time.Second)
			continue
		}
		uuid, _ := e.Device.GetUUID()
		log.Printf("Xid %d on %s: marking it Unhealthy", e.EventData, uuid)
		p.markUnhealthy(uuid)
	}
}

func register() error {
	conn, err := grpc.NewClient("unix://"+api.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = api.NewRegistrationClient(conn).Register(ctx, &api.RegisterRequest{
		Version: api.Version, Endpoint: socket, ResourceName: resource,
	})
	return err
}

func main() {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		log.Fatalf("nvmlInit: %v", nvml.ErrorString(ret))
	}
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		log.Fatalf("nvmlDeviceGetCount: %v", nvml.ErrorString(ret))
	}
	p := &plugin{devices: map[string]string{}, changed: make(chan struct{}, 1)}
	var handles []nvml.Device
	for i := 0; i < count; i++ {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			log.Fatalf("nvmlDeviceGetHandleByIndex(%d): %v", i, nvml.ErrorString(ret))
		}
		uuid, _ := d.GetUUID()
		p.devices[uuid] = api.Healthy
		handles = append(handles, d)
	}

	path := filepath.Join(api.DevicePluginPath, socket)
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		log.Fatalf("listen %s: %v", path, err)
	}
	srv := grpc.NewServer()
	api.RegisterDevicePluginServer(srv, p)
	go func() { log.Fatal(srv.Serve(lis)) }()
	if err := register(); err != nil {
		log.Fatalf("register with kubelet: %v", err)
	}
	log.Printf("registered %s with kubelet: serving %d devices", resource, count)
	p.watch(handles)
}
