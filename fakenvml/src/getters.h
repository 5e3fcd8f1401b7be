/* Macros for the many one-value device getters: validate the output pointer, take the
 * lock and the device (UNINITIALIZED / INVALID_ARGUMENT / GPU_IS_LOST as NVML does),
 * compute, release. The header's prototype checks each expansion's signature. */
#ifndef FAKENVML_GETTERS_H
#define FAKENVML_GETTERS_H

#include "fake.h"

#define DEVICE_GETTER(fn, type, expr)                                                              \
    nvmlReturn_t fn(nvmlDevice_t device, type *out) {                                              \
        const fnv_device *d;                                                                       \
        if (!out) return NVML_ERROR_INVALID_ARGUMENT;                                              \
        nvmlReturn_t ret = fnv_device_enter(device, &d);                                           \
        if (ret != NVML_SUCCESS) return ret;                                                       \
        *out = (type)(expr);                                                                       \
        return fnv_leave(NVML_SUCCESS);                                                            \
    }

/* Like DEVICE_GETTER, but answers NOT_SUPPORTED when `supported` is false. */
#define DEVICE_GETTER_IF(fn, type, supported, expr)                                                \
    nvmlReturn_t fn(nvmlDevice_t device, type *out) {                                              \
        const fnv_device *d;                                                                       \
        if (!out) return NVML_ERROR_INVALID_ARGUMENT;                                              \
        nvmlReturn_t ret = fnv_device_enter(device, &d);                                           \
        if (ret != NVML_SUCCESS) return ret;                                                       \
        if (!(supported)) return fnv_leave(NVML_ERROR_NOT_SUPPORTED);                              \
        *out = (type)(expr);                                                                       \
        return fnv_leave(NVML_SUCCESS);                                                            \
    }

#define DEVICE_STRING_GETTER(fn, field)                                                            \
    nvmlReturn_t fn(nvmlDevice_t device, char *out, unsigned int length) {                         \
        const fnv_device *d;                                                                       \
        nvmlReturn_t ret = fnv_device_enter(device, &d);                                           \
        if (ret != NVML_SUCCESS) return ret;                                                       \
        return fnv_leave(fnv_copy_str(out, length, d->field));                                     \
    }

/* Opens a hand-written device function body: declares d, enters, returns on error. */
#define DEVICE_ENTER(device) DEVICE_ENTER_AS(__func__, device)
/* The same in a static helper, entering under its exported caller's name `fn`. */
#define DEVICE_ENTER_AS(fn, device)                                                                \
    const fnv_device *d;                                                                           \
    do {                                                                                           \
        nvmlReturn_t ret_ = fnv_device_enter_as(fn, device, &d);                                   \
        if (ret_ != NVML_SUCCESS) return ret_;                                                     \
    } while (0)

/* A device list the fake never has entries for (running processes, encoder/FBC sessions,
 * accounted PIDs): a valid device answers a count of 0 and writes no entries. */
#define DEVICE_EMPTY_LIST(fn, entry_type)                                                          \
    nvmlReturn_t fn(nvmlDevice_t device, unsigned int *count, entry_type *entries) {               \
        (void)entries;                                                                             \
        if (!count) return NVML_ERROR_INVALID_ARGUMENT;                                            \
        DEVICE_ENTER(device);                                                                      \
        (void)d;                                                                                   \
        *count = 0;                                                                                \
        return fnv_leave(NVML_SUCCESS);                                                            \
    }

#endif
