/* What a device measures: memory, BAR1, temperature, power, energy, utilisation, clocks,
 * performance state, fans. Values are the profile's idle readings from the state file. */
#include <stddef.h>
#include <time.h>

#include "getters.h"

enum { CLK_GRAPHICS, CLK_SM, CLK_MEM, CLK_VIDEO };

/* ---- memory ---- */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* v1 folds the driver's reservation into "used", as real NVML does. */
    memory->total = d->memory_total;
    memory->used = d->memory_used + d->memory_reserved;
    memory->free = memory->total - memory->used;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    DEVICE_ENTER(device);
    memory->total = d->memory_total;
    memory->reserved = d->memory_reserved;
    memory->used = d->memory_used;
    memory->free = d->memory_total - d->memory_reserved - d->memory_used;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory) {
    if (!bar1Memory) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    bar1Memory->bar1Total = d->bar1_total;
    bar1Memory->bar1Used = 2u << 20; /* the driver maps a couple of MiB at boot */
    if (bar1Memory->bar1Used > d->bar1_total) bar1Memory->bar1Used = d->bar1_total;
    bar1Memory->bar1Free = d->bar1_total - bar1Memory->bar1Used;
    return fnv_leave(NVML_SUCCESS);
}

/* ---- temperature ---- */

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType,
                                      unsigned int *temp) {
    if (!temp || sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    *temp = d->temp_gpu;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    if (!temperature) return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    temperature->temperature = (int)d->temp_gpu;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                               nvmlTemperatureThresholds_t thresholdType,
                                               unsigned int *temp) {
    if (!temp || thresholdType >= NVML_TEMPERATURE_THRESHOLD_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: *temp = d->temp_shutdown; break;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: *temp = d->temp_slowdown; break;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX:
        if (!d->temp_mem_max) return fnv_leave(NVML_ERROR_NOT_SUPPORTED); /* GDDR: no sensor */
        *temp = d->temp_mem_max;
        break;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: *temp = d->temp_gpu_max; break;
    default: return fnv_leave(NVML_ERROR_NOT_SUPPORTED); /* acoustic limits: fanless */
    }
    return fnv_leave(NVML_SUCCESS);
}

/* ---- power and energy ---- */

DEVICE_GETTER(nvmlDeviceGetPowerUsage, unsigned int, d->power_usage_mw)
DEVICE_GETTER(nvmlDeviceGetPowerManagementLimit, unsigned int, d->power_limit_mw)
DEVICE_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, unsigned int, d->power_default_mw)
DEVICE_GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, d->power_limit_mw)
DEVICE_GETTER(nvmlDeviceGetPowerManagementMode, nvmlEnableState_t, NVML_FEATURE_ENABLED)
DEVICE_GETTER(nvmlDeviceGetPowerState, nvmlPstates_t, d->pstate)
DEVICE_GETTER(nvmlDeviceGetPerformanceState, nvmlPstates_t, d->pstate)
DEVICE_GETTER(nvmlDeviceGetPowerSource, nvmlPowerSource_t, NVML_POWER_SOURCE_AC)

nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t device,
                                                          unsigned int *minLimit,
                                                          unsigned int *maxLimit) {
    if (!minLimit || !maxLimit) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    *minLimit = d->power_min_mw;
    *maxLimit = d->power_max_mw;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device, unsigned long long *energy) {
    if (!energy) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* Energy keeps growing at the idle draw, so consumers that diff two reads see power. */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    unsigned long long ms = (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000;
    *energy = d->energy_mj + ms * d->power_usage_mw / 1000000;
    return fnv_leave(NVML_SUCCESS);
}

/* ---- utilisation ---- */

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    utilization->gpu = d->util_gpu;
    utilization->memory = d->util_mem;
    return fnv_leave(NVML_SUCCESS);
}

#define IDLE_ENGINE(fn)                                                                            \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int *utilization, unsigned int *samplingPeriodUs) { \
        if (!utilization || !samplingPeriodUs) return NVML_ERROR_INVALID_ARGUMENT;                 \
        DEVICE_ENTER(device);                                                                      \
        (void)d;                                                                                   \
        *utilization = 0;                                                                          \
        *samplingPeriodUs = 100000; /* the driver's window (a real H100 reports 100 ms) */                            \
        return fnv_leave(NVML_SUCCESS);                                                            \
    }
IDLE_ENGINE(nvmlDeviceGetEncoderUtilization)
IDLE_ENGINE(nvmlDeviceGetDecoderUtilization)
IDLE_ENGINE(nvmlDeviceGetJpgUtilization)
IDLE_ENGINE(nvmlDeviceGetOfaUtilization)

/* ---- clocks ---- */

static int clock_slot(nvmlClockType_t type) {
    switch (type) {
    case NVML_CLOCK_GRAPHICS: return CLK_GRAPHICS;
    case NVML_CLOCK_SM: return CLK_SM;
    case NVML_CLOCK_MEM: return CLK_MEM;
    case NVML_CLOCK_VIDEO: return CLK_VIDEO;
    default: return -1;
    }
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    int slot = clock_slot(type);
    if (!clock || slot < 0) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    *clock = d->clocks[slot];
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                       unsigned int *clock) {
    int slot = clock_slot(type);
    if (!clock || slot < 0) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    *clock = d->max_clocks[slot];
    return fnv_leave(NVML_SUCCESS);
}

/* Application and customer-boost clocks per type, from the profile; 0: that clock has none
 * (a real H100 has no video application clock and boosts graphics/SM only). */
static nvmlReturn_t profile_clock(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock,
                                  size_t member) {
    int slot = clock_slot(type);
    if (!clock || slot < 0) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    unsigned value = ((const uint32_t *)((const char *)d + member))[slot];
    if (!value) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    *clock = value;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                            unsigned int *clockMHz) {
    return profile_clock(device, clockType, clockMHz, offsetof(fnv_device, app_clocks));
}

nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                   unsigned int *clockMHz) {
    return profile_clock(device, clockType, clockMHz, offsetof(fnv_device, app_clocks));
}

nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                unsigned int *clockMHz) {
    return profile_clock(device, clockType, clockMHz, offsetof(fnv_device, boost_clocks));
}

nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                nvmlClockId_t clockId, unsigned int *clockMHz) {
    switch (clockId) {
    case NVML_CLOCK_ID_CURRENT: return nvmlDeviceGetClockInfo(device, clockType, clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET:
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT:
        return profile_clock(device, clockType, clockMHz, offsetof(fnv_device, app_clocks));
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX:
        return profile_clock(device, clockType, clockMHz, offsetof(fnv_device, boost_clocks));
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

DEVICE_GETTER(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long,
              nvmlClocksEventReasonGpuIdle)
DEVICE_GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long,
              nvmlClocksEventReasonGpuIdle)
DEVICE_GETTER(nvmlDeviceGetSupportedClocksEventReasons, unsigned long long,
              d->clock_event_reasons)
DEVICE_GETTER(nvmlDeviceGetSupportedClocksThrottleReasons, unsigned long long,
              d->clock_event_reasons)

/* ---- fans: SXM boards have none, and NVML says NOT_SUPPORTED there ---- */

DEVICE_GETTER_IF(nvmlDeviceGetFanSpeed, unsigned int, d->fan_count > 0, d->fan_speed)
DEVICE_GETTER(nvmlDeviceGetNumFans, unsigned int, d->fan_count) /* SXM: 0 fans, SUCCESS */

nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t device, unsigned int fan, unsigned int *speed) {
    if (!speed) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (d->fan_count == 0) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    if (fan >= d->fan_count) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    *speed = d->fan_speed;
    return fnv_leave(NVML_SUCCESS);
}
