/* nvmlInternalGetExportTable: the private interface NVIDIA's nvidia-smi asks for right
 * after nvmlInit. It is not in nvml.h; everything here was read off nvidia-smi 535.261.03
 * (Debian's nvidia-smi 535.261.03-1) with objdump and by running it against a table whose
 * every slot logged its arguments and return address. docs/fakenvml.md, "The real
 * nvidia-smi".
 *
 * nvidia-smi calls nvmlInternalGetExportTable(&table, &guid) and, on any error, prints
 * "Mismatch in versions between nvidia-smi and NVML." and exits. The table is a size in
 * bytes followed by function pointers: before every call nvidia-smi checks
 * `size > 8 * slot` and that the pointer is not NULL, so slot N lives at byte 8 * N and
 * slot 0 is the size. Its highest slot is 243, hence 244 slots.
 *
 * Slots nvidia-smi 535 was seen calling (arguments as the call sites pass them):
 *   26   printf-style sink for every line nvidia-smi prints (the library's debug log);
 *        its return value is ignored. We drop the line.
 *   81   (unsigned index, char *name, unsigned length = 34): the name a GPU goes by in
 *        messages such as "Unable to determine the device handle for GPU%s: GPU is lost"
 *        and "infoROM is corrupted at gpu %s"; on error nvidia-smi prints the index
 *        instead. Real drivers print the PCI bus id there ("GPU0000:3B:00.0"), so it does.
 *   165  Relaxed Ordering Mode (-q, IBMNPU section)
 *   209  Voltage / Graphics in mV (-q)
 *   213, 214, 215 (device, unsigned *count, entries): the compute, MPS and graphics
 *        process lists (entries of 0x1020 bytes, capacity 500 passed in *count) for the
 *        "Processes" table and -q; layout at processes() below.
 *   226  PCIe atomic caps inbound/outbound (-q)
 *   230  (device, unsigned *gen): "Host Max" PCIe generation (-q, pcie.link.gen.hostmax)
 *   231  GPU Part Number, 232 Deferred Clocks / Memory, 237 FRU Part Number,
 *   240  GPU T.Limit temperatures (-q)
 *   242  (device, unsigned *mode): Addressing Mode, nvmlDeviceAddressingModeType_t's values
 *        (0 None, 1 HMM, 2 ATS), as nvmlDeviceGetAddressingMode answers (535 and 550)
 *   243  (device, unsigned *mode): Sparse Operation Mode, 0 Disabled, else Enabled (535;
 *        550 asks nothing and prints "Uninitialized")
 *   23   (const char *bus_id1, const char *bus_id2, unsigned *path): `topo -m`'s matrix cell
 *        for two GPUs named by their nvmlPciInfo_t busId: 0 PIX, 1 PXB, 2 PHB, 3 NODE,
 *        4 SYS, 4 + n "NV<n>" (n bonded NVLinks); on error "Failed to run topology matrix".
 *        Read by answering each value and reading the matrix (535 and 550 alike).
 *   72   (device, unsigned *flag): dmon and pmon keep the GPUs flagged non-zero; with none
 *        they print "Not supported on the device(s)".
 *   145  (device, u64 last seen timestamp, unsigned *, unsigned *): pmon's per-process
 *        utilization samples; unanswered, its sm/mem/enc/dec columns print "-".
 *   192  (device, policy *): `compute-policy --set-timeslice N` (535 and 550; NVIDIA's DRA
 *        driver runs it for a claim's TimeSlicing config); on error "Failed to set
 *        timeslice policy with value Short for GPU 3 : Not Supported".
 *   12   (const char *id, unsigned *domain, *bus, *device, *function): parses `-i ID` when
 *        ID has a colon; on error "Invalid PCI bus id format".
 *   75   (unsigned index, unsigned *domain, *bus, *device): a GPU's PCI location, which
 *        nvidia-smi compares with slot 12's answer (function 0) to find the GPU `-i` names;
 *        on error "Mismatch in expected NVML version".
 *
 * What the fake answers: 12 and 75 as described, 23 the inventory's topology, 26 success,
 * 72 1 for every GPU, 81 the bus id, 192 success (the policy is not kept), 213-215 the processes `fakenvml process add` put on
 * the GPU, 230 the device's max PCIe generation, 242 None, 243 Disabled on Hopper (the
 * H100 capture's -q: "Addressing Mode: None", "Sparse Operation Mode: Disabled"; a board
 * of another family answers NOT_SUPPORTED, N/A). nvidia-smi 550.163.01 asks for the same
 * GUID and uses the same slots for all of these. Every other slot answers NOT_SUPPORTED
 * and writes nothing, which
 * nvidia-smi prints as "N/A": success without writing makes it print whatever its
 * buffers held ("GPU Shutdown T.Limit Temp: -8 C", "Graphics: 2.619 mV"). */
#include <stdio.h>
#include <string.h>

#include "getters.h"

#define EXPORT_SLOTS 244

typedef struct {
    uint32_t data1;
    uint16_t data2, data3;
    uint8_t data4[8];
} fnv_guid;

nvmlReturn_t nvmlInternalGetExportTable(const void **table, const fnv_guid *guid);

/* 6c3efec4-8fc9-4e6c-a327-ee696e12f7c4, stored as the bytes nvidia-smi passes
 * (c4 fe 3e 6c c9 8f 6c 4e a3 27 ...): Microsoft's GUID layout, little-endian fields. */
static const fnv_guid SMI_GUID = {
    0x6c3efec4, 0x8fc9, 0x4e6c, {0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4}};

typedef void (*fnv_slot)(void);

static struct {
    uint64_t size; /* bytes, the size field included */
    fnv_slot slots[EXPORT_SLOTS - 1];
} table_;
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

/* Callers pass arguments to every slot; on the SysV and AAPCS64 ABIs a callee that
 * ignores them is safe to call with any. */
static nvmlReturn_t not_supported(void) { return NVML_ERROR_NOT_SUPPORTED; }

static nvmlReturn_t debug_log(const char *fmt, ...) {
    (void)fmt;
    return NVML_SUCCESS;
}

static nvmlReturn_t gpu_name(unsigned int index, char *name, unsigned int length) {
    if (!name) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    if (index >= fnv_g->nvisible) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    /* A lost GPU keeps its bus id: that is what the message about it needs. */
    const fnv_device *d = &fnv_g->devices[fnv_g->visible[index]];
    int n = snprintf(name, length, "%04X:%02X:%02X.%X", d->pci_domain & 0xFFFF, d->pci_bus & 0xFF,
                     d->pci_device & 0xFF, d->pci_function & 0xF);
    return fnv_leave(n < 0 || (unsigned)n >= length ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS);
}

static nvmlReturn_t parse_bus_id(const char *id, unsigned int *domain, unsigned int *bus,
                                 unsigned int *device, unsigned int *function) {
    unsigned dom, b, dev, fn;
    if (!id || !domain || !bus || !device || !function) return NVML_ERROR_INVALID_ARGUMENT;
    if (!fnv_parse_bus_id(id, &dom, &b, &dev, &fn)) return NVML_ERROR_INVALID_ARGUMENT;
    *domain = dom, *bus = b, *device = dev, *function = fn;
    return NVML_SUCCESS;
}

static nvmlReturn_t pci_location(unsigned int index, unsigned int *domain, unsigned int *bus,
                                 unsigned int *device) {
    if (!domain || !bus || !device) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    if (index >= fnv_g->nvisible) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fnv_device *d = &fnv_g->devices[fnv_g->visible[index]]; /* lost or not, as slot 81 */
    *domain = d->pci_domain, *bus = d->pci_bus, *device = d->pci_device;
    return fnv_leave(NVML_SUCCESS);
}

/* Slots 213-215: the processes using a GPU, one list each for compute (213), MPS compute
 * (214, never: no MPS server here) and graphics (215); nvidia-smi shows a pid in several
 * lists as C+G (M for MPS). Its Processes table leaves out a pid without a name (one this
 * host does not run, as a container's nvidia-smi does for other namespaces'); -q lists
 * them all. An entry is 0x1020 bytes: pid (u32) at 0, used GPU memory in bytes (u64)
 * at 8, GPU and compute instance ids (u32, ~0: not a MIG device) at 16 and 20, and the
 * process name (NUL-terminated) at 32, which the Processes table prints: found by filling
 * entries with markers and reading nvidia-smi 535's output. */
#define PROCESS_ENTRY 0x1020
#define PROCESS_NAME_AT 32

/* A MIG device lists none: `fakenvml process add` puts processes on whole GPUs. */
static nvmlReturn_t mig_processes(nvmlDevice_t device, unsigned int *count) {
    uint32_t gpu, gi, ci;
    nvmlReturn_t ret = fnv_enter_as("nvmlInternalGetExportTable");
    if (ret != NVML_SUCCESS) return ret;
    if (!fnv_mig_handle(device, &gpu, &gi, &ci)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (fnv_g->faults[gpu].lost) return fnv_leave(NVML_ERROR_GPU_IS_LOST);
    *count = 0;
    return fnv_leave(NVML_SUCCESS);
}

static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, uint8_t *entries,
                              uint32_t kind) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (fnv_is_mig_handle(device)) return mig_processes(device, count);
    DEVICE_ENTER(device);
    const fnv_live *l = &fnv_g->live[d->index];
    unsigned n = 0;
    for (uint32_t i = 0; i < l->nprocs; i++) {
        if (!(l->procs[i].kinds & kind)) continue;
        if (n == *count || !entries) {
            n++; /* counted, not written: the caller's array is full */
            continue;
        }
        uint8_t *e = entries + (size_t)n++ * PROCESS_ENTRY;
        const uint32_t pid = l->procs[i].pid, none = FNV_NO_INSTANCE;
        const uint64_t used = l->procs[i].used;
        memset(e, 0, PROCESS_ENTRY);
        memcpy(e, &pid, sizeof pid);
        memcpy(e + 8, &used, sizeof used);
        memcpy(e + 16, &none, sizeof none);
        memcpy(e + 20, &none, sizeof none);
        fnv_process_name(pid, (char *)e + PROCESS_NAME_AT, PROCESS_ENTRY - PROCESS_NAME_AT);
    }
    nvmlReturn_t ret = n > *count ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return fnv_leave(ret);
}

static nvmlReturn_t compute_processes(nvmlDevice_t device, unsigned int *count, uint8_t *entries) {
    return processes(device, count, entries, FNV_PROC_COMPUTE);
}

static nvmlReturn_t graphics_processes(nvmlDevice_t device, unsigned int *count, uint8_t *entries) {
    return processes(device, count, entries, FNV_PROC_GRAPHICS);
}

static nvmlReturn_t mps_processes(nvmlDevice_t device, unsigned int *count, uint8_t *entries) {
    return processes(device, count, entries, 0);
}

static nvmlReturn_t host_max_pcie_gen(nvmlDevice_t device, unsigned int *gen) {
    if (!gen) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    *gen = d->pcie_gen; /* the host's slots match the GPU's, as nvmlDeviceGetMaxPcie... */
    return fnv_leave(NVML_SUCCESS);
}

/* The GPU whose PCI bus id is `bus_id`, lost or not; lock held. */
static const fnv_device *by_bus_id(const char *bus_id) {
    unsigned dom, bus, dev, fn;
    if (!bus_id || !fnv_parse_bus_id(bus_id, &dom, &bus, &dev, &fn)) return NULL;
    for (uint32_t i = 0; i < fnv_g->count; i++) {
        const fnv_device *d = &fnv_g->devices[i];
        if (d->pci_domain == dom && d->pci_bus == bus && d->pci_device == dev &&
            d->pci_function == fn)
            return d;
    }
    return NULL;
}

/* Slot 23's answer for a pair of GPUs: NVLink first, else the PCIe path
 * (nvmlGpuTopologyLevel_t's SINGLE..SYSTEM are 10..50). */
#define TOPO_NVLINK_BASE 4

static nvmlReturn_t topology_path(const char *bus_id1, const char *bus_id2, unsigned int *path) {
    if (!path) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    const fnv_device *a = by_bus_id(bus_id1), *b = by_bus_id(bus_id2);
    if (!a || !b) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    if (fnv_g->faults[a->index].lost || fnv_g->faults[b->index].lost)
        return fnv_leave(NVML_ERROR_GPU_IS_LOST);
    const unsigned links = fnv_nvlinks_between(a, b);
    const nvmlGpuTopologyLevel_t level = fnv_common_ancestor(a, b);
    if (links)
        *path = TOPO_NVLINK_BASE + links;
    else if (level == NVML_TOPOLOGY_INTERNAL)
        *path = 0; /* a GPU with itself: nvidia-smi prints X without asking */
    else
        *path = (unsigned)level / 10 - 1;
    return fnv_leave(NVML_SUCCESS);
}

static nvmlReturn_t monitored(nvmlDevice_t device, unsigned int *flag) {
    if (!flag) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    *flag = 1;
    return fnv_leave(NVML_SUCCESS);
}

static nvmlReturn_t addressing_mode(nvmlDevice_t device, unsigned int *mode) {
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDeviceAddressingMode_t m = {.version = nvmlDeviceAddressingMode_v1};
    nvmlReturn_t ret = nvmlDeviceGetAddressingMode(device, &m);
    if (ret == NVML_SUCCESS) *mode = m.value;
    return ret;
}

static nvmlReturn_t sparse_operation_mode(nvmlDevice_t device, unsigned int *mode) {
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (d->arch != NVML_DEVICE_ARCH_HOPPER) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    *mode = 0; /* Disabled */
    return fnv_leave(NVML_SUCCESS);
}

/* Slot 192: `compute-policy --set-timeslice`'s setter. A board takes it (from root) and
 * the fake keeps nothing: no consumer reads the policy back through NVML. */
static nvmlReturn_t set_timeslice(nvmlDevice_t device, const void *policy) {
    if (!policy) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    return fnv_leave(NVML_SUCCESS);
}

static void fill_table(void) {
    table_.size = sizeof table_;
    for (unsigned i = 1; i < EXPORT_SLOTS; i++) table_.slots[i - 1] = (fnv_slot)not_supported;
    table_.slots[12 - 1] = (fnv_slot)parse_bus_id;
    table_.slots[23 - 1] = (fnv_slot)topology_path;
    table_.slots[26 - 1] = (fnv_slot)debug_log;
    table_.slots[72 - 1] = (fnv_slot)monitored;
    table_.slots[75 - 1] = (fnv_slot)pci_location;
    table_.slots[81 - 1] = (fnv_slot)gpu_name;
    table_.slots[192 - 1] = (fnv_slot)set_timeslice;
    table_.slots[213 - 1] = (fnv_slot)compute_processes;
    table_.slots[214 - 1] = (fnv_slot)mps_processes;
    table_.slots[215 - 1] = (fnv_slot)graphics_processes;
    table_.slots[230 - 1] = (fnv_slot)host_max_pcie_gen;
    table_.slots[242 - 1] = (fnv_slot)addressing_mode;
    table_.slots[243 - 1] = (fnv_slot)sparse_operation_mode;
}

nvmlReturn_t nvmlInternalGetExportTable(const void **table, const fnv_guid *guid) {
    if (!table || !guid) return NVML_ERROR_INVALID_ARGUMENT;
    if (memcmp(guid, &SMI_GUID, sizeof SMI_GUID) != 0) return NVML_ERROR_NOT_SUPPORTED;
    pthread_once(&table_once, fill_table);
    *table = &table_;
    return NVML_SUCCESS;
}
