/* ECC: modes, counters bumped by injected ECC faults, and their consequences — retired
 * pages before Ampere, remapped rows from Ampere on (each arch answers NOT_SUPPORTED for
 * the other mechanism, as real boards do). */
#include "getters.h"

static int remaps_rows(const fnv_device *d) { return fnv_arch_since(d, NVML_DEVICE_ARCH_AMPERE); }

static const fnv_fault *fault_of(const fnv_device *d) { return &fnv_g->faults[d->index]; }

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                  nvmlEnableState_t *pending) {
    if (!current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    *current = *pending = d->ecc_enabled ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return fnv_leave(NVML_SUCCESS);
}

DEVICE_GETTER(nvmlDeviceGetDefaultEccMode, nvmlEnableState_t,
              d->ecc_enabled ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED)

static nvmlReturn_t ecc_count(const fnv_device *d, nvmlMemoryErrorType_t errorType,
                              nvmlEccCounterType_t counterType, unsigned long long *out) {
    if (!out || counterType >= NVML_ECC_COUNTER_TYPE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->ecc_enabled) return NVML_ERROR_NOT_SUPPORTED;
    switch (errorType) {
    case NVML_MEMORY_ERROR_TYPE_CORRECTED: *out = fault_of(d)->ecc_sbe; break;
    case NVML_MEMORY_ERROR_TYPE_UNCORRECTED: *out = fault_of(d)->ecc_dbe; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                         nvmlEccCounterType_t counterType,
                                         unsigned long long *eccCounts) {
    DEVICE_ENTER(device);
    return fnv_leave(ecc_count(d, errorType, counterType, eccCounts));
}

/* Injected errors land in device memory (DRAM); other locations count zero. A MIG device
 * counts in its GPU's locations and has counted nothing (faults are injected into whole
 * GPUs); nvidia-smi -q prints its "ECC Errors" from here. unsourced: no MIG capture. */
nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                             nvmlEccCounterType_t counterType,
                                             nvmlMemoryLocation_t locationType,
                                             unsigned long long *count) {
    if (locationType >= NVML_MEMORY_LOCATION_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDevice_t parent = NULL;
    const int mig = fnv_is_mig_handle(device);
    if (mig) {
        nvmlReturn_t ret = nvmlDeviceGetDeviceHandleFromMigDeviceHandle(device, &parent);
        if (ret != NVML_SUCCESS) return ret;
        device = parent;
    }
    DEVICE_ENTER(device);
    nvmlReturn_t ret = ecc_count(d, errorType, counterType, count);
    if (ret == NVML_SUCCESS && mig) *count = 0;
    /* Each board counts ECC errors in some locations only (H100: DRAM and SRAM). */
    if (ret == NVML_SUCCESS && !(d->ecc_locations >> locationType & 1u)) ret = NVML_ERROR_NOT_SUPPORTED;
    if (ret == NVML_SUCCESS && locationType != NVML_MEMORY_LOCATION_DEVICE_MEMORY) *count = 0;
    return fnv_leave(ret);
}

nvmlReturn_t nvmlDeviceGetDetailedEccErrors(nvmlDevice_t device, nvmlMemoryErrorType_t errorType,
                                            nvmlEccCounterType_t counterType,
                                            nvmlEccErrorCounts_t *eccCounts) {
    if (!eccCounts) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    unsigned long long n;
    nvmlReturn_t ret = ecc_count(d, errorType, counterType, &n);
    if (ret == NVML_SUCCESS) *eccCounts = (nvmlEccErrorCounts_t){.deviceMemory = n};
    return fnv_leave(ret);
}

static nvmlReturn_t retired_pages(const char *fn, nvmlDevice_t device,
                                  nvmlPageRetirementCause_t cause, unsigned int *pageCount,
                                  unsigned long long *addresses, unsigned long long *timestamps) {
    if (!pageCount || cause >= NVML_PAGE_RETIREMENT_CAUSE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER_AS(fn, device);
    if (remaps_rows(d)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    const fnv_fault *f = fault_of(d);
    /* Only double-bit errors retire pages here; single-bit retirement needs repeats. */
    uint64_t n = cause == NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR ? f->retired_dbe_pages : 0;
    if (n > 64) n = 64; /* the InfoROM page table holds a bounded list */
    if (*pageCount < n || (n && !addresses)) {
        *pageCount = (unsigned)n;
        return fnv_leave(NVML_ERROR_INSUFFICIENT_SIZE);
    }
    for (uint64_t i = 0; i < n; i++) {
        addresses[i] = ((uint64_t)d->index << 32) | ((i + 1) << 12); /* distinct 4 KiB pages */
        if (timestamps) timestamps[i] = 0;
    }
    *pageCount = (unsigned)n;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                       unsigned int *pageCount, unsigned long long *addresses) {
    return retired_pages(__func__, device, cause, pageCount, addresses, NULL);
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t device, nvmlPageRetirementCause_t cause,
                                          unsigned int *pageCount, unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    return retired_pages(__func__, device, cause, pageCount, addresses, timestamps);
}

DEVICE_GETTER_IF(nvmlDeviceGetRetiredPagesPendingStatus, nvmlEnableState_t, !remaps_rows(d),
                 fault_of(d)->retired_dbe_pages ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED)

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows,
                                       unsigned int *uncRows, unsigned int *isPending,
                                       unsigned int *failureOccurred) {
    if (!corrRows || !uncRows || !isPending || !failureOccurred) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (!remaps_rows(d)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    const fnv_fault *f = fault_of(d);
    /* Each double-bit error remaps its row; the remap applies at the next GPU reset. */
    *corrRows = 0;
    *uncRows = (unsigned)f->ecc_dbe;
    *isPending = f->ecc_dbe > 0;
    *failureOccurred = 0;
    return fnv_leave(NVML_SUCCESS);
}
