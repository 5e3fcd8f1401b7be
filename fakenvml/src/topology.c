/* Where devices sit: NUMA and CPU affinity, the PCIe tree (common ancestor, nearest GPUs),
 * NVLink, and peer-to-peer status. The tree is stored per GPU as switch / upper switch /
 * host bridge / NUMA ids, so no N x N table is needed for 1024 GPUs. */
#include <stdio.h>
#include <string.h>

#include "getters.h"

nvmlGpuTopologyLevel_t fnv_common_ancestor(const fnv_device *a, const fnv_device *b) {
    if (a == b) return NVML_TOPOLOGY_INTERNAL;
    if (a->host_bridge == b->host_bridge) {
        if (a->pcie_switch == b->pcie_switch) return NVML_TOPOLOGY_SINGLE;
        if (a->pcie_upper_switch == b->pcie_upper_switch) return NVML_TOPOLOGY_MULTIPLE;
        return NVML_TOPOLOGY_HOSTBRIDGE;
    }
    if (a->numa_node == b->numa_node) return NVML_TOPOLOGY_NODE;
    return NVML_TOPOLOGY_SYSTEM;
}

static int links_to_switch(const fnv_link *l) {
    return l->active && l->remote_kind == NVML_NVLINK_DEVICE_TYPE_SWITCH;
}

/* The NVLinks joining two GPUs: a's active links to b, and a's active links into an NVSwitch
 * that b links into too (an 8-GPU baseboard's switches are its own; two boards' GPUs do not
 * reach each other). Through switches every link of a counts: `nvidia-smi topo -m` shows NV18
 * between any two GPUs of an 8 x H100 NVSwitch board (github.com/HazyResearch/ThunderKittens
 * issue 167), whose 18 links reach four switches. */
unsigned fnv_nvlinks_between(const fnv_device *a, const fnv_device *b) {
    unsigned n = 0;
    for (unsigned i = 0; i < a->nvlink_count; i++) {
        const fnv_link *l = &a->links[i];
        if (l->active && l->remote_kind == NVML_NVLINK_DEVICE_TYPE_GPU && l->remote_index == b->index)
            n++;
        if (!links_to_switch(l)) continue;
        for (unsigned j = 0; j < b->nvlink_count; j++)
            if (links_to_switch(&b->links[j]) &&
                strcmp(l->remote_bus_id, b->links[j].remote_bus_id) == 0) {
                n++;
                break;
            }
    }
    return n;
}

/* Second handle of a two-device call; the lock is held by the caller. */
static const fnv_device *peer(nvmlDevice_t device, nvmlReturn_t *ret) {
    uint32_t i;
    if (!fnv_handle_index(device, &i)) {
        *ret = NVML_ERROR_INVALID_ARGUMENT;
        return NULL;
    }
    if (fnv_g->faults[i].lost) {
        *ret = NVML_ERROR_GPU_IS_LOST;
        return NULL;
    }
    return &fnv_g->devices[i];
}

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t *pathInfo) {
    if (!pathInfo) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device1);
    nvmlReturn_t ret = NVML_SUCCESS;
    const fnv_device *e = peer(device2, &ret);
    /* In a VM the driver sees no PCIe tree around the GPU: the H100 capture answers
       NOT_SUPPORTED for the GPU with itself (unsourced for two GPUs of one VM). */
    if (e && d == e && fnv_g->header.platform == FNV_PLATFORM_VM_PASSTHROUGH)
        ret = NVML_ERROR_NOT_SUPPORTED;
    else if (e)
        *pathInfo = fnv_common_ancestor(d, e);
    return fnv_leave(ret);
}

nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device, nvmlGpuTopologyLevel_t level,
                                              unsigned int *count, nvmlDevice_t *deviceArray) {
    /* A buffer of zero entries is refused, as the real driver does: a GPU with no peers
     * answers pynvml's second call (count 0, a buffer) with INVALID_ARGUMENT. */
    if (!count || (*count && !deviceArray) || (!*count && deviceArray))
        return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    unsigned found = 0;
    for (uint32_t i = 0; i < fnv_g->count; i++) {
        const fnv_device *e = &fnv_g->devices[i];
        if (e == d || fnv_common_ancestor(d, e) > level) continue;
        if (*count && found < *count) deviceArray[found] = &fnv_handles[i];
        found++;
    }
    /* count 0 asks how many; otherwise fill at most *count. */
    if (*count == 0 || found < *count) *count = found;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetTopologyGpuSet(unsigned int cpuNumber, unsigned int *count,
                                         nvmlDevice_t *deviceArray) {
    if (!count || (*count && !deviceArray)) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    unsigned found = 0;
    for (uint32_t i = 0; i < fnv_g->count; i++) {
        const fnv_device *e = &fnv_g->devices[i];
        if (cpuNumber < e->cpu_first || cpuNumber >= e->cpu_first + e->cpu_count) continue;
        if (*count && found < *count) deviceArray[found] = &fnv_handles[i];
        found++;
    }
    if (*count == 0 || found < *count) *count = found;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                    nvmlGpuP2PCapsIndex_t p2pIndex, nvmlGpuP2PStatus_t *p2pStatus) {
    if (!p2pStatus) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device1);
    nvmlReturn_t ret = NVML_SUCCESS;
    const fnv_device *e = peer(device2, &ret);
    if (!e) return fnv_leave(ret);
    /* What a real H100 answers: indexes past the known ones report OK, and a GPU is no
     * peer of itself (tests/fakenvml/data/h100/h100-walk.json). */
    if (p2pIndex >= NVML_P2P_CAPS_INDEX_UNKNOWN) {
        *p2pStatus = NVML_P2P_STATUS_OK;
        return fnv_leave(NVML_SUCCESS);
    }
    if (d == e) {
        *p2pStatus = NVML_P2P_STATUS_NOT_SUPPORTED;
        return fnv_leave(NVML_SUCCESS);
    }
    int linked = fnv_nvlinks_between(d, e) > 0;
    if (p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK)
        *p2pStatus = linked ? NVML_P2P_STATUS_OK : NVML_P2P_STATUS_NOT_SUPPORTED;
    else /* PCIe peer traffic does not cross CPU sockets on these boards */
        *p2pStatus = linked || fnv_common_ancestor(d, e) <= NVML_TOPOLOGY_HOSTBRIDGE
                         ? NVML_P2P_STATUS_OK
                         : NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED;
    return fnv_leave(NVML_SUCCESS);
}

/* ---- NUMA and affinity ---- */

/* A VM shows the GPU no NUMA node of its own (the H100 capture: NOT_SUPPORTED). */
DEVICE_GETTER_IF(nvmlDeviceGetNumaNodeId, unsigned int,
                 d->numa_node != FNV_NO_NUMA &&
                     fnv_g->header.platform != FNV_PLATFORM_VM_PASSTHROUGH,
                 d->numa_node)

static void set_bits(unsigned long *set, unsigned int words, unsigned first, unsigned n) {
    const unsigned bits = 8 * sizeof *set;
    memset(set, 0, words * sizeof *set);
    for (unsigned b = first; b < first + n && b / bits < words; b++) set[b / bits] |= 1UL << (b % bits);
}

static nvmlReturn_t cpu_affinity(const char *fn, nvmlDevice_t device, unsigned int cpuSetSize,
                                 unsigned long *cpuSet, nvmlAffinityScope_t scope) {
    if (!cpuSet || cpuSetSize == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET)
        return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER_AS(fn, device);
    set_bits(cpuSet, cpuSetSize, d->cpu_first, d->cpu_count); /* one socket per NUMA node */
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                      unsigned long *cpuSet) {
    return cpu_affinity(__func__, device, cpuSetSize, cpuSet, NVML_AFFINITY_SCOPE_NODE);
}

nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device, unsigned int cpuSetSize,
                                                 unsigned long *cpuSet, nvmlAffinityScope_t scope) {
    return cpu_affinity(__func__, device, cpuSetSize, cpuSet, scope);
}

nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                         unsigned long *nodeSet, nvmlAffinityScope_t scope) {
    if (!nodeSet || nodeSetSize == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET)
        return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (d->numa_node == FNV_NO_NUMA) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    set_bits(nodeSet, nodeSetSize, d->numa_node, 1);
    return fnv_leave(NVML_SUCCESS);
}

/* ---- NVLink: NOT_SUPPORTED without links, INVALID_ARGUMENT past the last one, as real
 * boards answer (consumers probe links 0..35 and rely on exactly these codes) ---- */

static nvmlReturn_t link_of(const fnv_device *d, unsigned int link, const fnv_link **out) {
    if (d->nvlink_count == 0) return NVML_ERROR_NOT_SUPPORTED;
    if (link >= d->nvlink_count) return NVML_ERROR_INVALID_ARGUMENT;
    *out = &d->links[link];
    return NVML_SUCCESS;
}

#define LINK_ENTER(device, link, out) LINK_ENTER_AS(__func__, device, link, out)
#define LINK_ENTER_AS(fn, device, link, out)                                                       \
    DEVICE_ENTER_AS(fn, device);                                                                    \
    const fnv_link *l;                                                                             \
    do {                                                                                           \
        nvmlReturn_t ret_ = link_of(d, link, &l);                                                  \
        if (ret_ != NVML_SUCCESS) return fnv_leave(ret_);                                          \
    } while (0)

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                      nvmlEnableState_t *isActive) {
    if (!isActive) return NVML_ERROR_INVALID_ARGUMENT;
    LINK_ENTER(device, link, l);
    *isActive = l->active ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                        unsigned int *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    LINK_ENTER(device, link, l);
    (void)l;
    *version = d->nvlink_version;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                           nvmlNvLinkCapability_t capability,
                                           unsigned int *capResult) {
    if (!capResult || capability >= NVML_NVLINK_CAP_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* The index is checked against the board's links before anything else, hidden or not:
       a VM's H100 answers INVALID_ARGUMENT at links 18 and 19, NOT_SUPPORTED below. */
    if (d->nvlink_board && link >= d->nvlink_board) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fnv_link *l;
    nvmlReturn_t ret = link_of(d, link, &l);
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    /* Data-centre NVLink: P2P and atomics yes, system memory and SLI no. */
    *capResult = capability == NVML_NVLINK_CAP_P2P_SUPPORTED ||
                 capability == NVML_NVLINK_CAP_P2P_ATOMICS || capability == NVML_NVLINK_CAP_VALID;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                 nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType) {
    if (!pNvLinkDeviceType) return NVML_ERROR_INVALID_ARGUMENT;
    LINK_ENTER(device, link, l);
    *pNvLinkDeviceType = (nvmlIntNvLinkDeviceType_t)l->remote_kind;
    return fnv_leave(NVML_SUCCESS);
}

/* Past the last link the remote's PCI info is NOT_SUPPORTED, not INVALID_ARGUMENT:
 * `nvidia-smi topo -m` (535, 550) asks links 0..17 of every GPU with NVLinks and gives up
 * ("Failed to run topology matrix") on any other error, which a real 12-link A100 does not
 * make it do (github.com/NVIDIA/nccl issue 1505: NV12); the H100 capture answers
 * NOT_SUPPORTED at link 18 as well. */
static nvmlReturn_t remote_pci(const char *fn_name, nvmlDevice_t device, unsigned int link,
                               nvmlPciInfo_t *pci) {
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER_AS(fn_name, device);
    if (link >= d->nvlink_count) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    const fnv_link *l = &d->links[link];
    fnv_device remote;
    memset(&remote, 0, sizeof remote);
    unsigned dom = 0, bus = 0, dev = 0, fn = 0;
    fnv_parse_bus_id(l->remote_bus_id, &dom, &bus, &dev, &fn);
    remote.pci_domain = dom;
    remote.pci_bus = bus;
    remote.pci_device = dev;
    remote.pci_function = fn;
    remote.pci_device_id = l->remote_device_id;
    memcpy(remote.bus_id, l->remote_bus_id, sizeof remote.bus_id);
    fnv_fill_pci(&remote, pci);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                 nvmlPciInfo_t *pci) {
    return remote_pci(__func__, device, link, pci);
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                              nvmlPciInfo_t *pci) {
    return remote_pci(__func__, device, link, pci);
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
                                             nvmlNvLinkErrorCounter_t counter,
                                             unsigned long long *counterValue) {
    if (!counterValue || counter >= NVML_NVLINK_ERROR_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    LINK_ENTER(device, link, l);
    (void)l;
    *counterValue = 0;
    return fnv_leave(NVML_SUCCESS);
}

/* ---- the NVLink fabric: Hopper and later on an NVSwitch system ---- */

/* What the fabric manager registered a GPU as. Every GPU on one NVSwitch baseboard reaches
 * the same switches, so the lowest switch number it reaches names its board: the clique
 * (+1, never 0). The cluster is the node's: one UUID of CRC-32s of "<node>/fabric/<k>". A
 * Hopper or later GPU on no NVSwitch (a PCIe board, direct links, a VM that hides them)
 * answers, with SUCCESS, that the fabric is not supported; older families have no call. */
typedef struct {
    unsigned char cluster[NVML_GPU_FABRIC_UUID_LEN];
    unsigned clique;
    nvmlGpuFabricState_t state;
    unsigned health;
    unsigned char summary;
} fabric;

#define FABRIC_HEALTHY                                                                             \
    (NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW | \
     NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_RECOVERY_FALSE                                              \
         << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY |                                     \
     NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE                                             \
         << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY |                                    \
     NVML_GPU_FABRIC_HEALTH_MASK_ACCESS_TIMEOUT_RECOVERY_FALSE                                     \
         << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY |                            \
     NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE                                      \
         << NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION)

static nvmlReturn_t fabric_of(const fnv_device *d, fabric *f) {
    if (d->arch < NVML_DEVICE_ARCH_HOPPER || d->arch == NVML_DEVICE_ARCH_UNKNOWN)
        return NVML_ERROR_NOT_SUPPORTED;
    memset(f, 0, sizeof *f); /* NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, health not supported */
    uint32_t lowest = UINT32_MAX;
    for (unsigned i = 0; i < d->nvlink_count; i++)
        if (links_to_switch(&d->links[i]) && d->links[i].remote_index < lowest)
            lowest = d->links[i].remote_index;
    if (lowest == UINT32_MAX) return NVML_SUCCESS;
    f->state = NVML_GPU_FABRIC_STATE_COMPLETED;
    f->clique = lowest + 1;
    f->health = FABRIC_HEALTHY;
    f->summary = NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY;
    char key[sizeof fnv_g->header.node_name + 16];
    for (unsigned k = 0; k < 4; k++) {
        snprintf(key, sizeof key, "%s/fabric/%u", fnv_g->header.node_name, k);
        uint32_t crc = fnv_crc32(key, strlen(key));
        memcpy(&f->cluster[4 * k], &crc, sizeof crc);
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *gpuFabricInfo) {
    if (!gpuFabricInfo) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    fabric f;
    nvmlReturn_t ret = fabric_of(d, &f);
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    memcpy(gpuFabricInfo->clusterUuid, f.cluster, sizeof f.cluster);
    gpuFabricInfo->status = NVML_SUCCESS;
    gpuFabricInfo->cliqueId = f.clique;
    gpuFabricInfo->state = f.state;
    return fnv_leave(NVML_SUCCESS);
}

/* v2 and v3 share their fields up to healthMask; only v3 has room for the summary. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *gpuFabricInfo) {
    if (!gpuFabricInfo) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = gpuFabricInfo->version;
    if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    DEVICE_ENTER(device);
    fabric f;
    nvmlReturn_t ret = fabric_of(d, &f);
    if (ret != NVML_SUCCESS) return fnv_leave(ret);
    nvmlGpuFabricInfo_v2_t *v2 = (nvmlGpuFabricInfo_v2_t *)gpuFabricInfo;
    memcpy(v2->clusterUuid, f.cluster, sizeof f.cluster);
    v2->status = NVML_SUCCESS;
    v2->cliqueId = f.clique;
    v2->state = f.state;
    v2->healthMask = f.health;
    if (version == nvmlGpuFabricInfo_v3) gpuFabricInfo->healthSummary = f.summary;
    return fnv_leave(NVML_SUCCESS);
}
