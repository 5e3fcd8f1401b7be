/* The library's ground floor: helpers that every unit may call and that call nothing of
 * ours. CRC-32 (state.bin, journal records, knob ids, MIG UUIDs), the log line, NVML's
 * string and PCI conventions, and the slot a handle's address names. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "fake.h"

uint32_t fnv_crc32(const void *buf, size_t len) {
    /* zlib's CRC-32 (reflected 0xEDB88320), bitwise: the state is read once per init. */
    const uint8_t *p = buf;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < len; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

void fnv_log(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakenvml: %s\n", line);
}

nvmlReturn_t fnv_copy_str(char *dst, unsigned int length, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if (length < n + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

int fnv_parse_bus_id(const char *text, unsigned *domain, unsigned *bus, unsigned *dev,
                     unsigned *fn) {
    char tail;
    *domain = 0;
    *fn = 0;
    /* NVML accepts domain:bus:device.function, with or without domain and function. */
    if (sscanf(text, "%x:%x:%x.%x%c", domain, bus, dev, fn, &tail) == 4) return 1;
    if (sscanf(text, "%x:%x.%x%c", bus, dev, fn, &tail) == 3) return 1;
    if (sscanf(text, "%x:%x:%x%c", domain, bus, dev, &tail) == 3) return 1;
    return 0;
}

void fnv_fill_pci(const fnv_device *d, nvmlPciInfo_t *pci) {
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busId, sizeof pci->busId, "%s", d->bus_id);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", d->pci_domain & 0xFFFF,
             d->pci_bus & 0xFF, d->pci_device & 0xFF, d->pci_function & 0xF);
    pci->domain = d->pci_domain;
    pci->bus = d->pci_bus;
    pci->device = d->pci_device;
    pci->pciDeviceId = d->pci_device_id;
    pci->pciSubSystemId = d->pci_subsystem_id;
}

long fnv_slot_of(const void *p, const void *table, size_t size, size_t n) {
    uintptr_t a = (uintptr_t)p, base = (uintptr_t)table;
    if (!p || a < base || a >= base + size * n || (a - base) % size) return -1;
    return (long)((a - base) / size);
}
