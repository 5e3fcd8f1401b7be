/* What a device measures: memory, BAR1, temperature, power, energy, utilisation, clocks,
 * performance state, fans. Values are the profile's idle readings from the state file,
 * unless `fakenvml set` put a value or a wave in the journal (fnv_live). */
#include <stddef.h>
#include <string.h>
#include <time.h>

#include "getters.h"

enum { CLK_GRAPHICS, CLK_SM, CLK_MEM, CLK_VIDEO };
/* The driver's utilisation sample period: a real H100 reports 100 ms for its encoder,
 * decoder, JPEG and OFA windows (the capture); processes are sampled on the same beat. */
#define SAMPLE_PERIOD_US 100000ull

/* ---- live values (their arithmetic: wave.c) ---- */

static uint64_t profile_value(const fnv_device *d, enum fnv_sensor s) {
    switch (s) {
    case FNV_S_TEMPERATURE: return d->temp_gpu;
    case FNV_S_POWER: return d->power_usage_mw;
    case FNV_S_UTIL: return d->util_gpu;
    case FNV_S_MEM_UTIL: return d->util_mem;
    case FNV_S_GRAPHICS_CLOCK:
    case FNV_S_SM_CLOCK:
    case FNV_S_MEM_CLOCK:
    case FNV_S_VIDEO_CLOCK: return d->clocks[s - FNV_S_GRAPHICS_CLOCK];
    case FNV_S_PSTATE: return d->pstate;
    case FNV_S_COMPUTE_MODE: return d->compute_mode;
    case FNV_S_CLOCK_REASONS: /* an idle GPU says so; a busy one has no reason to slow */
        return fnv_sensor(d, FNV_S_UTIL) ? 0 : nvmlClocksEventReasonGpuIdle;
    default: return 0; /* memory temperature: the profile's field (identity.c) */
    }
}

uint64_t fnv_sensor(const fnv_device *d, enum fnv_sensor s) {
    const fnv_wave *w = &fnv_g->live[d->index].sensor[s];
    if (!w->set) return profile_value(d, s);
    return w->period_ms ? fnv_wave_at(w, fnv_now_ns()) : w->from;
}

uint64_t fnv_memory_used(const fnv_device *d) {
    const fnv_live *l = &fnv_g->live[d->index];
    uint64_t used = d->memory_used, room = d->memory_total - d->memory_reserved;
    for (uint32_t i = 0; i < l->nprocs; i++) used += l->procs[i].used;
    return used < room ? used : room; /* the driver never reports more than there is */
}

/* The counter since boot (CLOCK_MONOTONIC 0) at the powers set so far, so consumers that
 * diff two reads see the power of the moment, and every process reads the same. */
unsigned long long fnv_energy_mj(const fnv_device *d) {
    const fnv_live *l = &fnv_g->live[d->index];
    double e = (double)d->energy_mj + l->energy_mj +
               fnv_energy_between(d, &l->sensor[FNV_S_POWER], l->energy_ns, fnv_now_ns());
    return (unsigned long long)e;
}

/* ---- memory ---- */

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (fnv_is_mig_handle(device)) {
        nvmlReturn_t ret = fnv_mig_memory(device, &memory->total);
        if (ret == NVML_SUCCESS) memory->used = 0, memory->free = memory->total;
        return ret;
    }
    DEVICE_ENTER(device);
    /* v1 folds the driver's reservation into "used", as real NVML does. */
    memory->total = d->memory_total;
    memory->used = fnv_memory_used(d) + d->memory_reserved;
    memory->free = memory->total - memory->used;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    if (!memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (fnv_is_mig_handle(device)) {
        nvmlReturn_t ret = fnv_mig_memory(device, &memory->total);
        if (ret == NVML_SUCCESS) memory->reserved = memory->used = 0, memory->free = memory->total;
        return ret;
    }
    DEVICE_ENTER(device);
    memory->total = d->memory_total;
    memory->reserved = d->memory_reserved;
    memory->used = fnv_memory_used(d);
    memory->free = d->memory_total - d->memory_reserved - memory->used;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1Memory) {
    if (!bar1Memory) return NVML_ERROR_INVALID_ARGUMENT;
    if (fnv_is_mig_handle(device)) {
        nvmlReturn_t ret = fnv_mig_bar1(device, &bar1Memory->bar1Total);
        if (ret == NVML_SUCCESS)
            bar1Memory->bar1Used = 0, bar1Memory->bar1Free = bar1Memory->bar1Total;
        return ret;
    }
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
    *temp = (unsigned)fnv_sensor(d, FNV_S_TEMPERATURE);
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature) {
    if (!temperature) return NVML_ERROR_INVALID_ARGUMENT;
    if (temperature->version != nvmlTemperature_v1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (temperature->sensorType != NVML_TEMPERATURE_GPU) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    temperature->temperature = (int)fnv_sensor(d, FNV_S_TEMPERATURE);
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

DEVICE_GETTER(nvmlDeviceGetPowerUsage, unsigned int, fnv_sensor(d, FNV_S_POWER))
DEVICE_GETTER(nvmlDeviceGetPowerManagementLimit, unsigned int, d->power_limit_mw)
DEVICE_GETTER(nvmlDeviceGetPowerManagementDefaultLimit, unsigned int, d->power_default_mw)
DEVICE_GETTER(nvmlDeviceGetEnforcedPowerLimit, unsigned int, d->power_limit_mw)
DEVICE_GETTER(nvmlDeviceGetPowerManagementMode, nvmlEnableState_t, NVML_FEATURE_ENABLED)
DEVICE_GETTER(nvmlDeviceGetPowerState, nvmlPstates_t, fnv_sensor(d, FNV_S_PSTATE))
DEVICE_GETTER(nvmlDeviceGetPerformanceState, nvmlPstates_t, fnv_sensor(d, FNV_S_PSTATE))
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
    *energy = fnv_energy_mj(d);
    return fnv_leave(NVML_SUCCESS);
}

/* ---- utilisation ---- */

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    if (!utilization) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    utilization->gpu = (unsigned)fnv_sensor(d, FNV_S_UTIL);
    utilization->memory = (unsigned)fnv_sensor(d, FNV_S_MEM_UTIL);
    return fnv_leave(NVML_SUCCESS);
}

#define IDLE_ENGINE(fn)                                                                            \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int *utilization, unsigned int *samplingPeriodUs) { \
        if (!utilization || !samplingPeriodUs) return NVML_ERROR_INVALID_ARGUMENT;                 \
        DEVICE_ENTER(device);                                                                      \
        (void)d;                                                                                   \
        *utilization = 0;                                                                          \
        *samplingPeriodUs = SAMPLE_PERIOD_US;                                                      \
        return fnv_leave(NVML_SUCCESS);                                                            \
    }
IDLE_ENGINE(nvmlDeviceGetEncoderUtilization)
IDLE_ENGINE(nvmlDeviceGetDecoderUtilization)
IDLE_ENGINE(nvmlDeviceGetJpgUtilization)
IDLE_ENGINE(nvmlDeviceGetOfaUtilization)

/* ---- per-process utilisation: the processes `fakenvml process add` put on the GPU ---- */

/* The samples newer than `since` (CPU microseconds): one per process that used the GPU in
 * the last sample period (all-zero ones are left out, as the driver leaves them), at its
 * own utilisation or an even share of the GPU's among those without one, stamped at the
 * last period boundary, or when it was added if that is later. So a consumer that polls
 * faster than the period with the stamp it last saw is told NOT_FOUND, as by a driver. */
static unsigned process_samples(const fnv_device *d, unsigned long long since,
                                nvmlProcessUtilizationSample_t out[FNV_MAX_PROCESSES]) {
    const fnv_live *l = &fnv_g->live[d->index];
    unsigned shared = 0, n = 0;
    for (uint32_t i = 0; i < l->nprocs; i++) shared += !l->procs[i].util_set;
    uint64_t sm = shared ? fnv_sensor(d, FNV_S_UTIL) / shared : 0;
    uint64_t mem = shared ? fnv_sensor(d, FNV_S_MEM_UTIL) / shared : 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    unsigned long long now = (unsigned long long)ts.tv_sec * 1000000u + (unsigned long long)ts.tv_nsec / 1000u;
    unsigned long long boundary = now - now % SAMPLE_PERIOD_US;
    for (uint32_t i = 0; i < l->nprocs && n < FNV_MAX_PROCESSES; i++) {
        const fnv_process *p = &l->procs[i];
        unsigned s = p->util_set ? p->sm : (unsigned)sm, m = p->util_set ? p->mem : (unsigned)mem;
        unsigned long long at = p->since_us > boundary ? p->since_us : boundary;
        if ((!s && !m) || at > now || at <= since) continue;
        out[n++] = (nvmlProcessUtilizationSample_t){.pid = p->pid, .timeStamp = at, .smUtil = s,
                                                   .memUtil = m};
    }
    return n;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    /* nvml.h: "On MIG-enabled GPUs, querying process utilization is not currently supported" */
    if (fnv_g->mig[d->index].current == NVML_DEVICE_MIG_ENABLE)
        return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    nvmlProcessUtilizationSample_t samples[FNV_MAX_PROCESSES];
    unsigned n = process_samples(d, lastSeenTimeStamp, samples);
    nvmlReturn_t ret = NVML_SUCCESS;
    if (n == 0) /* "If no valid sample entries are found since the lastSeenTimeStamp" */
        ret = NVML_ERROR_NOT_FOUND;
    else if (!utilization || *processSamplesCount < n) /* the size query, or too small */
        ret = NVML_ERROR_INSUFFICIENT_SIZE;
    else
        memcpy(utilization, samples, n * sizeof samples[0]);
    *processSamplesCount = n;
    return fnv_leave(ret);
}

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

static nvmlReturn_t current_clock(const char *fn, nvmlDevice_t device, nvmlClockType_t type,
                                  unsigned int *clock) {
    int slot = clock_slot(type);
    if (!clock || slot < 0) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER_AS(fn, device);
    *clock = (unsigned)fnv_sensor(d, (enum fnv_sensor)(FNV_S_GRAPHICS_CLOCK + slot));
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock) {
    return current_clock(__func__, device, type, clock);
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
static nvmlReturn_t profile_clock(const char *fn, nvmlDevice_t device, nvmlClockType_t type,
                                  unsigned int *clock, size_t member) {
    int slot = clock_slot(type);
    if (!clock || slot < 0) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER_AS(fn, device);
    unsigned value = ((const uint32_t *)((const char *)d + member))[slot];
    if (!value) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
    *clock = value;
    return fnv_leave(NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                            unsigned int *clockMHz) {
    return profile_clock(__func__, device, clockType, clockMHz, offsetof(fnv_device, app_clocks));
}

nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                   unsigned int *clockMHz) {
    return profile_clock(__func__, device, clockType, clockMHz, offsetof(fnv_device, app_clocks));
}

nvmlReturn_t nvmlDeviceGetMaxCustomerBoostClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                                unsigned int *clockMHz) {
    return profile_clock(__func__, device, clockType, clockMHz, offsetof(fnv_device, boost_clocks));
}

nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t device, nvmlClockType_t clockType,
                                nvmlClockId_t clockId, unsigned int *clockMHz) {
    switch (clockId) {
    case NVML_CLOCK_ID_CURRENT: return current_clock(__func__, device, clockType, clockMHz);
    case NVML_CLOCK_ID_APP_CLOCK_TARGET:
    case NVML_CLOCK_ID_APP_CLOCK_DEFAULT:
        return profile_clock(__func__, device, clockType, clockMHz, offsetof(fnv_device, app_clocks));
    case NVML_CLOCK_ID_CUSTOMER_BOOST_MAX:
        return profile_clock(__func__, device, clockType, clockMHz, offsetof(fnv_device, boost_clocks));
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
}

DEVICE_GETTER(nvmlDeviceGetCurrentClocksEventReasons, unsigned long long,
              fnv_sensor(d, FNV_S_CLOCK_REASONS))
DEVICE_GETTER(nvmlDeviceGetCurrentClocksThrottleReasons, unsigned long long,
              fnv_sensor(d, FNV_S_CLOCK_REASONS))
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

/* A fanless board (every SXM and passively cooled PCIe board in the profiles) has no fan
 * 0 to ask about: INVALID_ARGUMENT, as the captured H100 answers. Boards with fans: no
 * public RPM or range figures, so NOT_SUPPORTED rather than made-up numbers. */
nvmlReturn_t nvmlDeviceGetFanSpeedRPM(nvmlDevice_t device, nvmlFanSpeedInfo_t *fanSpeed) {
    if (!fanSpeed) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    if (fanSpeed->fan >= d->fan_count) return fnv_leave(NVML_ERROR_INVALID_ARGUMENT);
    return fnv_leave(NVML_ERROR_NOT_SUPPORTED);
}

nvmlReturn_t nvmlDeviceGetMinMaxFanSpeed(nvmlDevice_t device, unsigned int *minSpeed,
                                         unsigned int *maxSpeed) {
    if (!minSpeed || !maxSpeed) return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_ENTER(device);
    return fnv_leave(d->fan_count ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT);
}
