/* libFuzzer target for the state reader: arbitrary bytes must be rejected or parsed into
 * devices whose every string is terminated — never read out of bounds. */
#include <stdlib.h>
#include <string.h>

#include "fake.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fnv_header header;
    fnv_device *devices;
    char err[256];
    if (fnv_parse_state(data, size, &header, &devices, err, sizeof err) != 0) {
        if (strlen(err) == 0) abort(); /* every rejection must say why */
        return 0;
    }
    size_t total = strlen(header.driver_version) + strlen(header.node_name);
    for (uint32_t i = 0; i < header.device_count; i++) {
        const fnv_device *d = &devices[i];
        total += strlen(d->uuid) + strlen(d->name) + strlen(d->serial) + strlen(d->bus_id);
        if (d->nvlink_count > FNV_MAX_LINKS) abort();
        for (uint32_t l = 0; l < d->nvlink_count; l++) total += strlen(d->links[l].remote_bus_id);
    }
    free(devices);
    return total == (size_t)-1; /* keep the reads observable */
}
