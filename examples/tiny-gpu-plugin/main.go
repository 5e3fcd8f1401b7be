// tiny-gpu-plugin: a deliberately small Kubernetes device plugin for NVIDIA GPUs, written
// outside gpulab to show that gpulab tests any plugin through a subject file. It lists
// the GPUs NVML reports as resource example.com/gpu and marks a GPU Unhealthy on any Xid
// it is told about (it has no list of harmless Xids and never marks a GPU Healthy again).
//
// TINY_GPU_MODE chooses how a container learns which GPUs it got:
//
//	uuids (the default)  devices are the GPUs' UUIDs; Allocate puts them in TINY_GPU_UUIDS
//	devices              devices are nvidia<minor> (NVML's minor number); Allocate hands the
//	                     container /dev/nvidia<minor> of each GPU and the driver's control
//	                     nodes the host has (nvidiactl, nvidia-uvm, ...), and sets no env
//	opaque               as devices, but devices are named gpu-<8 hex digits>, a hash of the
//	                     UUID that says nothing of which GPU it is (as a plugin that numbers
//	                     its devices, or hashes them, would)
//
// In devices mode the host's /dev must be mounted at /dev: the plugin refuses to start
// when a GPU has no device node there (a driver that is not loaded yet), so the
// DaemonSet restarts it until the node has them.
package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"log"
	"net"
	"os"
	"path/filepath"
	"sort"
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
	modeVar  = "TINY_GPU_MODE"
	devDir   = "/dev"
)

// controlNodes go to every container that gets a GPU, those of them the host has:
// nvidiactl and nvidia-uvm wherever the driver is loaded, the others optional.
var controlNodes = []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"}

type plugin struct {
	api.UnimplementedDevicePluginServer
	nodes   bool              // devices/opaque mode: Allocate returns device nodes, not an env
	opaque  bool              // opaque mode: ids are hashes of the UUID
	control []string          // the control nodes found at start (devices mode)
	ids     map[string]string // GPU UUID -> device id (the UUID, nvidia<minor>, gpu-<hash>)
	paths   map[string]string // device id -> its device node (devices/opaque mode)
	mu      sync.Mutex
	health  map[string]string // device id -> health
	changed chan struct{}
}

func (p *plugin) list() []*api.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*api.Device, 0, len(p.health))
	for id, health := range p.health {
		out = append(out, &api.Device{ID: id, Health: health})
	}
	return out
}

func nodeSpec(path string) *api.DeviceSpec {
	return &api.DeviceSpec{ContainerPath: path, HostPath: path, Permissions: "rw"}
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
		if !p.nodes {
			resp.ContainerResponses = append(resp.ContainerResponses, &api.ContainerAllocateResponse{
				Envs: map[string]string{envVar: strings.Join(c.DevicesIds, ",")},
			})
			continue
		}
		got := &api.ContainerAllocateResponse{}
		for _, id := range c.DevicesIds {
			if !p.known(id) {
				return nil, fmt.Errorf("Allocate: no GPU %q on this node (it has %s)", id, p.names())
			}
			got.Devices = append(got.Devices, nodeSpec(p.paths[id]))
		}
		for _, path := range p.control {
			got.Devices = append(got.Devices, nodeSpec(path))
		}
		resp.ContainerResponses = append(resp.ContainerResponses, got)
	}
	return resp, nil
}

func (p *plugin) known(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.health[id]
	return ok
}

func (p *plugin) names() string {
	names := make([]string, 0, len(p.ids))
	for _, id := range p.ids {
		names = append(names, id)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func (p *plugin) markUnhealthy(uuid string) {
	id, ok := p.ids[uuid]
	if !ok {
		log.Printf("an Xid on %s, which this plugin does not serve: ignored", uuid)
		return
	}
	p.mu.Lock()
	p.health[id] = api.Unhealthy
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

// deviceID is how the plugin names GPU i to the kubelet, and its device node in devices
// and opaque mode (which must exist under /dev): its UUID; nvidia<minor>; gpu-<hash>.
func deviceID(i int, d nvml.Device, uuid string, p *plugin) (string, string) {
	if !p.nodes {
		return uuid, ""
	}
	minor, ret := d.GetMinorNumber()
	if ret != nvml.SUCCESS {
		log.Fatalf("nvmlDeviceGetMinorNumber(%d): %v", i, nvml.ErrorString(ret))
	}
	node := fmt.Sprintf("nvidia%d", minor)
	path := filepath.Join(devDir, node)
	if _, err := os.Stat(path); err != nil {
		log.Fatalf("devices mode: GPU %d (%s) has no device node: %v; mount the host's /dev "+
			"at /dev, on a host whose driver made /dev/nvidia<minor>", i, uuid, err)
	}
	if p.opaque {
		h := fnv.New32a()
		h.Write([]byte(uuid))
		return fmt.Sprintf("gpu-%08x", h.Sum32()), path
	}
	return node, path
}

// presentControlNodes are the control nodes this host's /dev has.
func presentControlNodes() []string {
	var found []string
	for _, name := range controlNodes {
		path := filepath.Join(devDir, name)
		if _, err := os.Stat(path); err == nil {
			found = append(found, path)
		}
	}
	return found
}

func main() {
	mode := os.Getenv(modeVar)
	if mode != "" && mode != "uuids" && mode != "devices" && mode != "opaque" {
		log.Fatalf("%s=%q: expected uuids (the default), devices or opaque", modeVar, mode)
	}
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		log.Fatalf("nvmlInit: %v", nvml.ErrorString(ret))
	}
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		log.Fatalf("nvmlDeviceGetCount: %v", nvml.ErrorString(ret))
	}
	p := &plugin{nodes: mode == "devices" || mode == "opaque", opaque: mode == "opaque",
		ids: map[string]string{}, paths: map[string]string{}, health: map[string]string{},
		changed: make(chan struct{}, 1)}
	var handles []nvml.Device
	for i := 0; i < count; i++ {
		d, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			log.Fatalf("nvmlDeviceGetHandleByIndex(%d): %v", i, nvml.ErrorString(ret))
		}
		uuid, _ := d.GetUUID()
		id, path := deviceID(i, d, uuid, p)
		p.ids[uuid] = id
		p.paths[id] = path
		p.health[id] = api.Healthy
		handles = append(handles, d)
	}
	if p.nodes {
		p.control = presentControlNodes()
		log.Printf("%s mode: %s, with control nodes [%s]", mode, p.names(), strings.Join(p.control, " "))
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
