/* Who a device is: names, ids, PCI identity, modes, capabilities. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "getters.h"

DEVICE_STRING_GETTER(nvmlDeviceGetSerial, serial)
DEVICE_STRING_GETTER(nvmlDeviceGetBoardPartNumber, part_number)
DEVICE_STRING_GETTER(nvmlDeviceGetVbiosVersion, vbios)
DEVICE_STRING_GETTER(nvmlDeviceGetInforomImageVersion, inforom)

DEVICE_GETTER(nvmlDeviceGetMinorNumber, unsigned int, d->minor)
DEVICE_GETTER(nvmlDeviceGetBrand, nvmlBrandType_t, d->brand)
DEVICE_GETTER(nvmlDeviceGetArchitecture, nvmlDeviceArchitecture_t, d->arch)
DEVICE_GETTER(nvmlDeviceGetBoardId, unsigned int, d->board_id)
DEVICE_GETTER(nvmlDeviceGetMultiGpuBoard, unsigned int, d->multi_gpu_board)
DEVICE_GETTER(nvmlDeviceGetModuleId, unsigned int, d->index + 1) /* SXM module ids are 1-based */
DEVICE_GETTER(nvmlDeviceGetPersistenceMode, nvmlEnableState_t, d->persistence)
DEVICE_GETTER(nvmlDeviceGetComputeMode, nvmlComputeMode_t, fnv_sensor(d, FNV_S_COMPUTE_MODE))
DEVICE_GETTER(nvmlDeviceGetDisplayMode, nvmlEnableState_t, d->display_mode)
DEVICE_GETTER(nvmlDeviceGetDisplayActive, nvmlEnableState_t, NVML_FEATURE_DISABLED)
/* The platform's: a GPU passed through to a VM says so (the H100 capture, and H200 and T4
 * `nvidia-smi -q` outputs taken in VMs: "Virtualization Mode: Pass-Through"). */
DEVICE_GETTER(nvmlDeviceGetVirtualizationMode, nvmlGpuVirtualizationMode_t,
              fnv_g->header.platform == FNV_PLATFORM_VM_PASSTHROUGH
                  ? NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
                  : NVML_GPU_VIRTUALIZATION_MODE_NONE)
DEVICE_GETTER(nvmlDeviceGetBusType, nvmlBusType_t, NVML_BUS_TYPE_PCIE)
DEVICE_GETTER(nvmlDeviceGetNumGpuCores, unsigned int, d->num_cores)
DEVICE_GETTER(nvmlDeviceGetMemoryBusWidth, unsigned int, d->memory_bus_width)
DEVICE_GETTER(nvmlDeviceGetIrqNum, unsigned int, 128 + d->index)
DEVICE_GETTER(nvmlDeviceGetMaxPcieLinkGeneration, unsigned int, d->pcie_gen)
DEVICE_GETTER(nvmlDeviceGetGpuMaxPcieLinkGeneration, unsigned int, d->pcie_gen)
DEVICE_GETTER(nvmlDeviceGetMaxPcieLinkWidth, unsigned int, d->pcie_width)
DEVICE_GETTER(nvmlDeviceGetCurrPcieLinkGeneration, unsigned int, d->pcie_gen)
DEVICE_GETTER(nvmlDeviceGetCurrPcieLinkWidth, unsigned int, d->pcie_width)
DEVICE_GETTER(nvmlDeviceGetPcieReplayCounter, unsigned int, 0)

/* nvmlDeviceGetPcieLinkMaxSpeed answers NVML_PCIE_LINK_MAX_SPEED_*, which numbers the
 * generations from 1 (a real Gen5 H100 answers 5); GetPcieSpeed answers MT/s. */
static unsigned pcie_speed_enum(unsigned gen) { return gen <= 6 ? gen : 0; }

static unsigned pcie_speed_mbps(unsigned gen) {
    /* Per-lane transfer rate in MT/s by generation, as NVML reports it. */
    static const unsigned rate[] = {0, 2500, 5000, 8000, 16000, 32000, 64000};
    return gen < sizeof rate / sizeof rate[0] ? rate[gen] : 0;
}
DEVICE_GETTER(nvmlDeviceGetPcieLinkMaxSpeed, unsigned int, pcie_speed_enum(d->pcie_gen))
DEVICE_GETTER(nvmlDeviceGetPcieSpeed, unsigned int, pcie_speed_mbps(d->pcie_gen))

nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter,
                                         unsigned int *value) {
    if (!value || counter >= NVML_PCIE_UTIL_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    *value = 0; /* KB/s: an idle fake GPU moves nothing */
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetInforomVersion(nvmlDevice_t device, nvmlInforomObject_t object,
                                         char *version, unsigned int length) {
    static const char *const versions[] = {"1.0", "5.0", "7.0"}; /* OEM, ECC, POWER */
    if (object >= NVML_INFOROM_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    return fnv_leave(fnv_copy_str(version, length, versions[object]));
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    if (!major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    *major = (int)d->cc_major;
    *minor = (int)d->cc_minor;
    return fnv_leave(NVML_SUCCESS);
}

/* ---- PCI ---- */

static nvmlReturn_t pci_info(const char *fn, nvmlDevice_t device, nvmlPciInfo_t *pci) {
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER_AS(fn, device);
    fnv_fill_pci(d, pci);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(__func__, device, pci);
}
nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(__func__, device, pci);
}
nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    return pci_info(__func__, device, pci);
}

nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t device, nvmlPciInfoExt_t *pci) {
    if (!pci) return NVML_ERROR_INVALID_ARGUMENT;
    if (pci->version != nvmlPciInfoExt_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    DEVICE_ENTER(device);
    nvmlPciInfo_t base;
    fnv_fill_pci(d, &base);
    memcpy(pci->busId, base.busId, sizeof pci->busId);
    pci->domain = d->pci_domain;
    pci->bus = d->pci_bus;
    pci->device = d->pci_device;
    pci->pciDeviceId = d->pci_device_id;
    pci->pciSubSystemId = d->pci_subsystem_id;
    pci->baseClass = 0x03; /* display controller */
    pci->subClass = 0x02;  /* 3D controller, as data-centre GPUs enumerate */
    return fnv_leave(NVML_SUCCESS);
}

/* ---- MIG: a fake GPU is always a full GPU (MIG disabled) ---- */


/* ---- running processes: those `fakenvml process add` put on the GPU; none under MPS ---- */

/* How many of the GPU's processes are of `kind`; SUCCESS when *count has room for them. */
static nvmlReturn_t process_count(const fnv_device *d, uint32_t kind, unsigned int *count,
                                  const void *infos) {
    const fnv_live *l = &fnv_g->live[d->index];
    unsigned n = 0;
    for (uint32_t i = 0; i < l->nprocs; i++) n += (l->procs[i].kinds & kind) != 0;
    nvmlReturn_t ret = *count < n || (n && !infos) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return ret;
}

#define PROCESS_LIST(fn, entry_type, kind, extra)                                                  \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int *count, entry_type *infos) {                 \
        if (!count) return NVML_ERROR_INVALID_ARGUMENT;                                            \
        DEVICE_ENTER(device);                                                                      \
        nvmlReturn_t ret = process_count(d, kind, count, infos);                                   \
        if (ret != NVML_SUCCESS) return fnv_leave(ret);                                            \
        const fnv_live *l = &fnv_g->live[d->index];                                                \
        for (uint32_t i = 0, o = 0; i < l->nprocs; i++) {                                          \
            if (!(l->procs[i].kinds & (kind))) continue;                                           \
            entry_type *e = &infos[o++];                                                           \
            memset(e, 0, sizeof *e);                                                               \
            e->pid = l->procs[i].pid;                                                              \
            e->usedGpuMemory = l->procs[i].used;                                                   \
            extra                                                                                  \
        }                                                                                          \
        return fnv_leave(NVML_SUCCESS);                                                            \
    }
/* MIG is off: no instance ids, as NVML says it. */
#define NO_MIG e->gpuInstanceId = e->computeInstanceId = 0xFFFFFFFFu;

PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, FNV_PROC_COMPUTE, )
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, FNV_PROC_COMPUTE, NO_MIG)
PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, FNV_PROC_COMPUTE, NO_MIG)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, FNV_PROC_GRAPHICS, )
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t, FNV_PROC_GRAPHICS, NO_MIG)
PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, FNV_PROC_GRAPHICS, NO_MIG)
DEVICE_EMPTY_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)
DEVICE_EMPTY_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_v2_t)
DEVICE_EMPTY_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)

nvmlReturn_t nvmlDeviceOnSameBoard(nvmlDevice_t device1, nvmlDevice_t device2, int *onSameBoard) {
    if (!onSameBoard) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device1);
    uint32_t other;
    if (!fnv_handle_index(device2, &other)) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    const fnv_device *e = &fnv_g->devices[other];
    *onSameBoard = d == e || (d->multi_gpu_board && d->board_id == e->board_id);
    return fnv_leave(NVML_SUCCESS);
}

/* ---- field values: the profile's table, with the values the state knows filled in ---- */

static const fnv_field *field_of(const fnv_device *d, unsigned id) {
    for (unsigned i = 0; i < d->field_count; i++)
        if (d->fields[i].id == id) return &d->fields[i];
    return NULL;
}

/* Whether the driver rejects the id: a FNV_FIELD_UNKNOWN entry's range id..value. */
static int field_rejected(const fnv_device *d, unsigned id) {
    for (unsigned i = 0; i < d->field_count; i++) {
        const fnv_field *f = &d->fields[i];
        if (f->type == FNV_FIELD_UNKNOWN && (id == f->id || (id > f->id && id <= f->value)))
            return 1;
    }
    return 0;
}

/* The value of a field the state holds (ECC, remapping, power); else the profile's. */
static uint64_t field_bits(const fnv_device *d, const fnv_field *f) {
    const fnv_fault *x = &fnv_g->faults[d->index];
    switch (f->id) {
    case NVML_FI_DEV_ECC_CURRENT:
    case NVML_FI_DEV_ECC_PENDING: return d->ecc_enabled != 0;
    case NVML_FI_DEV_ECC_SBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_SBE_AGG_TOTAL: return x->ecc_sbe;
    case NVML_FI_DEV_ECC_DBE_VOL_TOTAL:
    case NVML_FI_DEV_ECC_DBE_AGG_TOTAL:
    case NVML_FI_DEV_REMAPPED_UNC: return x->ecc_dbe;
    case NVML_FI_DEV_REMAPPED_PENDING: return x->ecc_dbe > 0;
    case NVML_FI_DEV_POWER_AVERAGE:
    case NVML_FI_DEV_POWER_INSTANT: return fnv_sensor(d, FNV_S_POWER);
    case NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: return fnv_energy_mj(d);
    case NVML_FI_DEV_MEMORY_TEMP: /* the profile's reading until `fakenvml set` moves it */
        return fnv_g->live[d->index].sensor[FNV_S_MEM_TEMPERATURE].set
                   ? fnv_sensor(d, FNV_S_MEM_TEMPERATURE)
                   : f->value;
    case NVML_FI_DEV_GPU_TEMP: { /* a double, in degrees C */
        double c = (double)fnv_sensor(d, FNV_S_TEMPERATURE);
        uint64_t bits;
        memcpy(&bits, &c, sizeof bits);
        return f->type == NVML_VALUE_TYPE_DOUBLE ? bits : (uint64_t)c;
    }
    case NVML_FI_DEV_POWER_MIN_LIMIT: return d->power_min_mw;
    case NVML_FI_DEV_POWER_MAX_LIMIT: return d->power_max_mw;
    case NVML_FI_DEV_POWER_DEFAULT_LIMIT: return d->power_default_mw;
    case NVML_FI_DEV_POWER_CURRENT_LIMIT:
    case NVML_FI_DEV_POWER_REQUESTED_LIMIT: return d->power_limit_mw;
    default: return f->value;
    }
}

static void put_value(nvmlFieldValue_t *v, unsigned type, uint64_t bits) {
    v->valueType = (nvmlValueType_t)type;
    switch (type) {
    case NVML_VALUE_TYPE_DOUBLE: memcpy(&v->value.dVal, &bits, sizeof v->value.dVal); break;
    case NVML_VALUE_TYPE_UNSIGNED_INT: v->value.uiVal = (unsigned)bits; break;
    case NVML_VALUE_TYPE_UNSIGNED_LONG: v->value.ulVal = (unsigned long)bits; break;
    case NVML_VALUE_TYPE_SIGNED_LONG_LONG: v->value.sllVal = (long long)bits; break;
    case NVML_VALUE_TYPE_SIGNED_INT: v->value.siVal = (int)(int64_t)bits; break;
    case NVML_VALUE_TYPE_UNSIGNED_SHORT: v->value.usVal = (unsigned short)bits; break;
    default: v->value.ullVal = bits; break;
    }
}

/* NVLink fields come from the GPU's links (the inventory's topology), as nvmlDeviceGetNvLink*
 * do, not from the profile's table; a GPU without links leaves them to the table
 * (NOT_SUPPORTED, as the capture's VM answers). Per-link fields take the link in scopeId.
 * The speed of an active link is the table's field 90 (the profile's, set by topology.py
 * where the GPU has links). Returns whether it answered v. */
static int nvlink_field(const fnv_device *d, nvmlFieldValue_t *v) {
    if (!d->nvlink_count) return 0;
    const fnv_field *common = field_of(d, NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON);
    const uint64_t speed = common ? common->value : 0;
    int any_active = 0;
    for (unsigned i = 0; i < d->nvlink_count; i++) any_active |= d->links[i].active != 0;
    switch (v->fieldId) {
    case NVML_FI_DEV_NVLINK_LINK_COUNT:
        put_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, d->nvlink_count);
        return 1;
    case NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON:
        put_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, any_active ? speed : 0);
        return 1;
    case NVML_FI_DEV_NVLINK_GET_SPEED:
    case NVML_FI_DEV_NVLINK_GET_STATE:
    case NVML_FI_DEV_NVLINK_GET_VERSION:
    case NVML_FI_DEV_NVLINK_GET_POWER_STATE: break;
    default: return 0;
    }
    if (v->scopeId >= d->nvlink_count) {
        v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
        return 1;
    }
    const int active = d->links[v->scopeId].active != 0;
    uint64_t value = 0; /* NVML_FI_DEV_NVLINK_GET_POWER_STATE: 0, high speed */
    if (v->fieldId == NVML_FI_DEV_NVLINK_GET_SPEED) value = active ? speed : 0;
    if (v->fieldId == NVML_FI_DEV_NVLINK_GET_STATE)
        value = active ? NVML_NVLINK_STATE_ACTIVE : NVML_NVLINK_STATE_INACTIVE;
    if (v->fieldId == NVML_FI_DEV_NVLINK_GET_VERSION) value = d->nvlink_version;
    put_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, value);
    return 1;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values) {
    if (valuesCount < 0 || (valuesCount && !values)) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
        v->latencyUsec = 0;
        v->nvmlReturn = NVML_SUCCESS;
        const fnv_field *f = field_of(d, v->fieldId);
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            /* Every profile: what the driver asks for after the faults injected so far. */
            put_value(v, NVML_VALUE_TYPE_UNSIGNED_INT, fnv_g->faults[d->index].recovery_action);
        } else if (field_rejected(d, v->fieldId)) {
            v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT; /* an id this driver does not know */
        } else if (nvlink_field(d, v)) { /* answered from the links */
        } else if (!f) {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        } else {
            put_value(v, f->type, field_bits(d, f));
        }
    }
    return fnv_leave(NVML_SUCCESS);
}

/* `nvidia-smi -c` (NVIDIA's MPS control daemon sets EXCLUSIVE_PROCESS with it, and DEFAULT
 * when it stops): a journal record, so every process on the node reads the new mode, and
 * it lasts until `fakenvml set ... compute-mode` or a re-init, as a real GPU's lasts until
 * the driver reloads. A MIG device has no mode of its own (nvml.h: the call takes a GPU). */
nvmlReturn_t nvmlDeviceSetComputeMode(nvmlDevice_t device, nvmlComputeMode_t mode) {
    if ((unsigned)mode >= NVML_COMPUTEMODE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (fnv_is_mig_handle(device)) return NVML_ERROR_NOT_SUPPORTED;
    const fnv_device *d;
    nvmlReturn_t ret = fnv_device_enter(device, &d);
    if (ret != NVML_SUCCESS) return ret;
    fnv_record rec = {.kind = FNV_SET, .gpu = d->index, .arg0 = FNV_S_COMPUTE_MODE,
                      .data = (uint64_t)mode};
    return fnv_leave(fnv_journal_append(fnv_g, &rec));
}
