/* What a board can do beyond its identity and sensors: supported clocks and P-states, MIG
 * GPU-instance profiles, accounting, encoder/FBC sessions, Confidential Computing, GSP and
 * repair status. Answers are a real H100's (tests/fakenvml/data/h100/h100-walk.json) where
 * the state carries no value: an idle, MIG-disabled, CC-off GPU with no sessions. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "getters.h"

/* ---- supported clocks and P-states: NOT_SUPPORTED where the profile has none ---- */

nvmlReturn_t nvmlDeviceGetSupportedMemoryClocks(nvmlDevice_t device, unsigned int *count,
                                                unsigned int *clocksMHz) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    unsigned n = d->mem_clock_count;
    if (!n) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    if (*count < n || !clocksMHz) {
        *count = n;
        return fnv_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    memcpy(clocksMHz, d->mem_clocks, n * sizeof *clocksMHz);
    *count = n;
    return fnv_leave(NVML_SUCCESS);
}

static int has_mem_clock(const fnv_device *d, unsigned mhz) {
    for (unsigned i = 0; i < d->mem_clock_count; i++)
        if (d->mem_clocks[i] == mhz) return 1;
    return 0;
}

/* Graphics clocks from the maximum down to the minimum in the profile's steps. */
nvmlReturn_t nvmlDeviceGetSupportedGraphicsClocks(nvmlDevice_t device, unsigned int memoryClockMHz,
                                                  unsigned int *count, unsigned int *clocksMHz) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (!d->mem_clock_count || !d->gfx_clock_step) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    if (!has_mem_clock(d, memoryClockMHz)) return fnv_leave(NVML_ERROR_NOT_FOUND);
    unsigned top = d->max_clocks[0], low = d->gfx_clock_min < top ? d->gfx_clock_min : top;
    unsigned n = (top - low) / d->gfx_clock_step + 1;
    if (*count < n || !clocksMHz) {
        *count = n;
        return fnv_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (unsigned i = 0; i < n; i++) clocksMHz[i] = top - i * d->gfx_clock_step;
    *count = n;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetSupportedPerformanceStates(nvmlDevice_t device, nvmlPstates_t *pstates,
                                                     unsigned int size) {
    if (!pstates) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    unsigned n = d->pstate_count, slots = size / sizeof *pstates;
    if (!n) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    if (slots < n) return fnv_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    for (unsigned i = 0; i < slots; i++)
        pstates[i] = i < n ? (nvmlPstates_t)d->pstates[i] : NVML_PSTATE_UNKNOWN;
    return fnv_leave(NVML_SUCCESS);
}

/* Graphics and SM clocks span min..max in every supported P-state; others: UNKNOWN, as a
 * real H100 answers for P-states it does not have. */
nvmlReturn_t nvmlDeviceGetMinMaxClockOfPState(nvmlDevice_t device, nvmlClockType_t type,
                                              nvmlPstates_t pstate, unsigned int *minClockMHz,
                                              unsigned int *maxClockMHz) {
    if (!minClockMHz || !maxClockMHz || type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (!d->pstate_count) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    int found = 0;
    for (unsigned i = 0; i < d->pstate_count; i++) found |= d->pstates[i] == (unsigned)pstate;
    if (!found) return fnv_leave(NVML_ERROR_UNKNOWN);
    unsigned max = d->max_clocks[type];
    *maxClockMHz = max;
    *minClockMHz = type == NVML_CLOCK_GRAPHICS || type == NVML_CLOCK_SM ? d->gfx_clock_min : max;
    return fnv_leave(NVML_SUCCESS);
}

/* One performance level per memory clock, lowest first, as "key=value, ..." text. */
static int perf_level(char *out, size_t size, const fnv_device *d, unsigned graphics, unsigned mem) {
    return snprintf(out, size,
                    "nvclock=%u, nvclockmin=%u, nvclockmax=%u, nvclockeditable=0, "
                    "memclock=%u, memclockmin=%u, memclockmax=%u, memclockeditable=0, "
                    "memTransferRate=%u, memTransferRatemin=%u, memTransferRatemax=%u, "
                    "memTransferRateeditable=0",
                    graphics, d->gfx_clock_min, d->max_clocks[0], mem, mem, mem, 2 * mem, 2 * mem,
                    2 * mem);
}

nvmlReturn_t nvmlDeviceGetPerformanceModes(nvmlDevice_t device, nvmlDevicePerfModes_t *perfModes) {
    if (!perfModes) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (!d->mem_clock_count) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    size_t used = 0, size = sizeof perfModes->str;
    perfModes->str[0] = '\0';
    for (unsigned i = 0; i < d->mem_clock_count && used < size; i++) {
        unsigned mem = d->mem_clocks[d->mem_clock_count - 1 - i];
        int n = snprintf(perfModes->str + used, size - used, "%sperf=%u, ", i ? " ; " : "", i);
        if (n < 0 || (size_t)n >= size - used) break;
        used += (size_t)n;
        n = perf_level(perfModes->str + used, size - used, d, d->gfx_clock_min, mem);
        if (n < 0) break;
        used += (size_t)n;
    }
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetCurrentClockFreqs(nvmlDevice_t device,
                                            nvmlDeviceCurrentClockFreqs_t *currentClockFreqs) {
    if (!currentClockFreqs) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (!d->mem_clock_count) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    perf_level(currentClockFreqs->str, sizeof currentClockFreqs->str, d,
               (unsigned)fnv_sensor(d, FNV_S_GRAPHICS_CLOCK), (unsigned)fnv_sensor(d, FNV_S_MEM_CLOCK));
    return fnv_leave(NVML_SUCCESS);
}

/* ---- MIG GPU-instance profiles (instances: mig.c) ---- */

static const fnv_mig_profile *mig_where(const fnv_device *d, int by_id, unsigned key) {
    for (unsigned i = 0; i < d->mig_count; i++)
        if ((by_id ? d->mig[i].id : d->mig[i].profile) == key) return &d->mig[i];
    return NULL;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    const fnv_mig_profile *m = mig_where(d, 0, profile);
    if (!m) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    /* version reads 0 afterwards, as a real H100 answers (h100-walk.json) */
    *info = (nvmlGpuInstanceProfileInfo_v2_t){
        .id = m->id, .isP2pSupported = m->is_p2p,
        .sliceCount = m->slice_count, .instanceCount = m->instance_count,
        .multiprocessorCount = m->multiprocessors, .copyEngineCount = m->copy_engines,
        .decoderCount = m->decoders, .encoderCount = m->encoders, .jpegCount = m->jpegs,
        .ofaCount = m->ofas, .memorySizeMB = m->memory_mib,
    };
    snprintf(info->name, sizeof info->name, "%s", m->name);
    return fnv_leave(NVML_SUCCESS);
}

/* v1: the same without name and version; go-nvml (NVIDIA's plugin, GFD) calls this one. */
nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlGpuInstanceProfileInfo_v2_t v2 = {.version = nvmlGpuInstanceProfileInfo_v2};
    nvmlReturn_t ret = nvmlDeviceGetGpuInstanceProfileInfoV(device, profile, &v2);
    if (ret == NVML_SUCCESS)
        *info = (nvmlGpuInstanceProfileInfo_t){
            .id = v2.id, .isP2pSupported = v2.isP2pSupported, .sliceCount = v2.sliceCount,
            .instanceCount = v2.instanceCount, .multiprocessorCount = v2.multiprocessorCount,
            .copyEngineCount = v2.copyEngineCount, .decoderCount = v2.decoderCount,
            .encoderCount = v2.encoderCount, .jpegCount = v2.jpegCount, .ofaCount = v2.ofaCount,
            .memorySizeMB = v2.memorySizeMB,
        };
    return ret;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t device,
                                                           unsigned int profileId,
                                                           nvmlGpuInstancePlacement_t *placements,
                                                           unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    const fnv_mig_profile *m = mig_where(d, 1, profileId);
    if (!m) return fnv_leave(d->mig_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED);
    unsigned n = (unsigned)__builtin_popcount(m->placement_starts);
    if (!placements) {
        *count = n;
        return fnv_leave(NVML_SUCCESS);
    }
    if (*count < n) return fnv_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    unsigned k = 0;
    for (unsigned s = 0; s < 32; s++)
        if (m->placement_starts >> s & 1u)
            placements[k++] = (nvmlGpuInstancePlacement_t){.start = s, .size = m->placement_size};
    *count = n;
    return fnv_leave(NVML_SUCCESS);
}


/* ---- accounting, sessions, offsets: an idle GPU with accounting off ---- */

DEVICE_GETTER(nvmlDeviceGetAccountingMode, nvmlEnableState_t, NVML_FEATURE_DISABLED)
DEVICE_GETTER(nvmlDeviceGetAccountingBufferSize, unsigned int, 4000) /* a real H100's */
DEVICE_GETTER(nvmlDeviceGetAdaptiveClockInfoStatus, unsigned int, NVML_ADAPTIVE_CLOCKING_INFO_STATUS_ENABLED)
DEVICE_GETTER(nvmlDeviceGetInforomConfigurationChecksum, unsigned int, 0)
DEVICE_GETTER(nvmlDeviceGetGpcClkVfOffset, int, 0)
DEVICE_GETTER(nvmlDeviceGetMemClkVfOffset, int, 0)

DEVICE_EMPTY_LIST(nvmlDeviceGetAccountingPids, unsigned int)
DEVICE_EMPTY_LIST(nvmlDeviceGetEncoderSessions, nvmlEncoderSessionInfo_t)
DEVICE_EMPTY_LIST(nvmlDeviceGetFBCSessions, nvmlFBCSessionInfo_t)

nvmlReturn_t nvmlDeviceGetEncoderStats(nvmlDevice_t device, unsigned int *sessionCount,
                                       unsigned int *averageFps, unsigned int *averageLatency) {
    if (!sessionCount || !averageFps || !averageLatency) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    *sessionCount = *averageFps = *averageLatency = 0;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetFBCStats(nvmlDevice_t device, nvmlFBCStats_t *fbcStats) {
    if (!fbcStats) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    *fbcStats = (nvmlFBCStats_t){0};
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetEncoderCapacity(nvmlDevice_t device, nvmlEncoderType_t encoderQueryType,
                                          unsigned int *encoderCapacity) {
    if (!encoderCapacity || encoderQueryType > NVML_ENCODER_QUERY_AV1)
        return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    *encoderCapacity = 100; /* percent left: nothing encodes */
    return fnv_leave(NVML_SUCCESS);
}

#define ZERO_PAIR(fn, type)                                                                        \
    nvmlReturn_t fn(nvmlDevice_t device, type *a, type *b) {                                       \
        if (!a || !b) return NVML_ERROR_INVALID_ARGUMENT;                                          \
        DEVICE_ENTER(device);                                                                      \
        (void)d;                                                                                   \
        *a = *b = 0;                                                                               \
        return fnv_leave(NVML_SUCCESS);                                                            \
    }
ZERO_PAIR(nvmlDeviceGetGpcClkMinMaxVfOffset, int)
ZERO_PAIR(nvmlDeviceGetMemClkMinMaxVfOffset, int)

nvmlReturn_t nvmlDeviceGetDynamicPstatesInfo(nvmlDevice_t device,
                                             nvmlGpuDynamicPstatesInfo_t *pDynamicPstatesInfo) {
    if (!pDynamicPstatesInfo) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    *pDynamicPstatesInfo = (nvmlGpuDynamicPstatesInfo_t){0};
    for (int i = 0; i < 4; i++) /* GPU, frame buffer, video decoder, bus */
        pDynamicPstatesInfo->utilization[i].bIsPresent = 1;
    pDynamicPstatesInfo->utilization[0].percentage = (unsigned)fnv_sensor(d, FNV_S_UTIL);
    pDynamicPstatesInfo->utilization[1].percentage = (unsigned)fnv_sensor(d, FNV_S_MEM_UTIL);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGridLicensableFeatures_v4(nvmlDevice_t device,
                                                    nvmlGridLicensableFeatures_t *features) {
    if (!features) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    *features = (nvmlGridLicensableFeatures_t){0}; /* no vGPU licensing on a bare GPU */
    return fnv_leave(NVML_SUCCESS);
}

/* ---- temperature margin, addressing, C2C, GSP, repair, PDI ---- */

nvmlReturn_t nvmlDeviceGetMarginTemperature(nvmlDevice_t device,
                                            nvmlMarginTemperature_t *marginTempInfo) {
    if (!marginTempInfo) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* "GPU T.Limit Temp" in nvidia-smi -q: N/A on an A100 (Ampere), read on an L40S (Ada). */
    if (!fnv_arch_since(d, NVML_DEVICE_ARCH_ADA)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    /* Distance to the slowdown-free limit: a real H100 at 46 C with 87 C max reads 41. */
    marginTempInfo->marginTemperature = (int)d->temp_gpu_max - (int)fnv_sensor(d, FNV_S_TEMPERATURE);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetAddressingMode(nvmlDevice_t device, nvmlDeviceAddressingMode_t *mode) {
    if (!mode) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    mode->value = NVML_DEVICE_ADDRESSING_MODE_NONE;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetC2cModeInfoV(nvmlDevice_t device, nvmlC2cModeInfo_v1_t *c2cModeInfo) {
    if (!c2cModeInfo) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* "GPU C2C Mode" in nvidia-smi -q: N/A on A100 and L40S, Disabled on H100 and H200. */
    if (!fnv_arch_since(d, NVML_DEVICE_ARCH_HOPPER)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    c2cModeInfo->isC2cEnabled = 0; /* PCIe-attached, no NVLink-C2C to a Grace CPU */
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGspFirmwareMode(nvmlDevice_t device, unsigned int *isEnabled,
                                          unsigned int *defaultMode) {
    if (!isEnabled || !defaultMode) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    *isEnabled = *defaultMode = 1; /* R580 runs GSP firmware on every data-centre GPU */
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGspFirmwareVersion(nvmlDevice_t device, char *version) {
    if (!version) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    /* The firmware ships with the driver and carries its version. */
    snprintf(version, NVML_GSP_FIRMWARE_VERSION_BUF_SIZE, "%s", fnv_g->header.driver_version);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRepairStatus(nvmlDevice_t device, nvmlRepairStatus_t *repairStatus) {
    if (!repairStatus) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* nvml.h: "For Ampere or newer fully supported devices." */
    if (!fnv_arch_since(d, NVML_DEVICE_ARCH_AMPERE)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    repairStatus->bChannelRepairPending = repairStatus->bTpcRepairPending = 0;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUnrepairableMemoryFlag_v1(nvmlDevice_t device,
                                                    nvmlUnrepairableMemoryStatus_v1_t *status) {
    if (!status) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* nvml.h: "For Hopper or newer fully supported devices." */
    if (!fnv_arch_since(d, NVML_DEVICE_ARCH_HOPPER)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    status->bUnrepairableMemory = 0;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t device,
                                               nvmlRowRemapperHistogramValues_t *values) {
    if (!values) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (!d->row_remap_max) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    /* Every bank still has all its spare rows: "max" counts banks with all available. */
    *values = (nvmlRowRemapperHistogramValues_t){.max = d->row_remap_max};
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetPdi(nvmlDevice_t device, nvmlPdi_t *pdi) {
    if (!pdi) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* A per-GPU identifier: derived from the UUID (FNV-1a), stable like the UUID. */
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = d->uuid; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    pdi->value = h;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, nvmlPerfPolicyType_t perfPolicyType,
                                          nvmlViolationTime_t *violTime) {
    if (!violTime) return NVML_ERROR_INVALID_ARGUMENT;
    /* Policies 0-5 and the two totals; a real H100 refuses 6 and 7. */
    if (perfPolicyType > NVML_PERF_POLICY_RELIABILITY &&
        perfPolicyType != NVML_PERF_POLICY_TOTAL_APP_CLOCKS &&
        perfPolicyType != NVML_PERF_POLICY_TOTAL_BASE_CLOCKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    violTime->referenceTime = (unsigned long long)ts.tv_sec * 1000000 + (unsigned long long)ts.tv_nsec / 1000;
    violTime->violationTime = 0; /* never throttled */
    return fnv_leave(NVML_SUCCESS);
}

/* ---- Confidential Computing (capable where the profile says so, never on) ---- */

nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device,
                                                 nvmlConfComputeMemSizeInfo_t *memInfo) {
    if (!memInfo) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* nvml.h: "For Ampere or newer fully supported devices." */
    if (!fnv_arch_since(d, NVML_DEVICE_ARCH_AMPERE)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    /* CC off: nothing protected; the rest is what the driver leaves usable. */
    memInfo->protectedMemSizeKib = 0;
    memInfo->unprotectedMemSizeKib = (d->memory_total - d->memory_reserved) >> 10;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetConfComputeProtectedMemoryUsage(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* nvml.h: "For Ampere or newer fully supported devices." */
    if (!fnv_arch_since(d, NVML_DEVICE_ARCH_AMPERE)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    *memory = (nvmlMemory_t){0};
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetConfComputeCapabilities(nvmlConfComputeSystemCaps_t *capabilities) {
    if (!capabilities) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    unsigned capable = 1;
    for (uint32_t i = 0; i < fnv_g->count; i++) capable &= fnv_g->devices[i].conf_compute != 0;
    capabilities->cpuCaps = NVML_CC_SYSTEM_CPU_CAPS_NONE; /* the CPU offers no TEE here */
    capabilities->gpusCaps = capable ? NVML_CC_SYSTEM_GPUS_CC_CAPABLE : NVML_CC_SYSTEM_GPUS_CC_NOT_CAPABLE;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetConfComputeState(nvmlConfComputeSystemState_t *state) {
    if (!state) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    *state = (nvmlConfComputeSystemState_t){0}; /* environment UNAVAILABLE, CC and devtools off */
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetConfComputeGpusReadyState(unsigned int *isAcceptingWork) {
    if (!isAcceptingWork) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    *isAcceptingWork = NVML_CC_ACCEPTING_CLIENT_REQUESTS_FALSE;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetConfComputeKeyRotationThresholdInfo(
    nvmlConfComputeGetKeyRotationThresholdInfo_t *pKeyRotationThrInfo) {
    if (!pKeyRotationThrInfo) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    pKeyRotationThrInfo->attackerAdvantage = 60; /* the driver's default (a real H100's) */
    return fnv_leave(NVML_SUCCESS);
}

/* ---- system: no HIC boards, NVLink at full bandwidth ---- */

nvmlReturn_t nvmlSystemGetHicVersion(unsigned int *hwbcCount, nvmlHwbcEntry_t *hwbcEntries) {
    (void)hwbcEntries;
    if (!hwbcCount) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    *hwbcCount = 0;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlSystemGetNvlinkBwMode(unsigned int *nvlinkBwMode) {
    if (!nvlinkBwMode) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t ret = fnv_enter();
    if (ret != NVML_SUCCESS) return ret;
    *nvlinkBwMode = 0; /* full bandwidth: the mode a real H100 reports */
    return fnv_leave(NVML_SUCCESS);
}

/* The black-box recorder has never flushed on a fresh node: NOT_READY, as the capture. */
nvmlReturn_t nvmlDeviceGetLastBBXFlushTime(nvmlDevice_t device, unsigned long long *timestamp,
                                           unsigned long *durationUs) {
    if (!timestamp || !durationUs) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    (void)d;
    return fnv_leave(NVML_ERROR_NOT_READY);
}

/* A CC-capable board with CC off has no attestation certificate to give: the captured H100
 * answers UNKNOWN; boards without CC do not support the call. */
nvmlReturn_t nvmlDeviceGetConfComputeGpuCertificate(nvmlDevice_t device,
                                                    nvmlConfComputeGpuCertificate_t *gpuCert) {
    if (!gpuCert) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    return fnv_leave(d->conf_compute ? NVML_ERROR_UNKNOWN : NVML_ERROR_NOT_SUPPORTED);
}
