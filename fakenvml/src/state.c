/* Reading state.bin: validate everything before trusting anything. fnv_parse_state is a
 * pure function over bytes so the fuzzer can drive it directly. fnv_load opens the journal
 * beside the state and checks it belongs to it; replaying it is journal.c's. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fake.h"

#define FNV_MAX_STATE_BYTES (sizeof(fnv_header) + (size_t)FNV_MAX_DEVICES * sizeof(fnv_device) + 4)

static void terminate(char *s, size_t size) { s[size - 1] = '\0'; }

/* Strings are fixed arrays; force termination so no later strlen can run off the end. */
static void sanitize_device(fnv_device *d) {
    terminate(d->uuid, sizeof d->uuid);
    terminate(d->name, sizeof d->name);
    terminate(d->serial, sizeof d->serial);
    terminate(d->part_number, sizeof d->part_number);
    terminate(d->vbios, sizeof d->vbios);
    terminate(d->inforom, sizeof d->inforom);
    terminate(d->bus_id, sizeof d->bus_id);
    if (d->nvlink_count > FNV_MAX_LINKS) d->nvlink_count = FNV_MAX_LINKS;
    for (unsigned i = 0; i < FNV_MAX_LINKS; i++)
        terminate(d->links[i].remote_bus_id, sizeof d->links[i].remote_bus_id);
    /* Counts bound the arrays every getter walks: clamp, never trust. */
    if (d->mem_clock_count > FNV_MAX_MEM_CLOCKS) d->mem_clock_count = FNV_MAX_MEM_CLOCKS;
    if (d->pstate_count > FNV_MAX_PSTATES) d->pstate_count = FNV_MAX_PSTATES;
    if (d->mig_count > FNV_MAX_MIG_PROFILES) d->mig_count = FNV_MAX_MIG_PROFILES;
    if (d->field_count > FNV_MAX_FIELDS) d->field_count = FNV_MAX_FIELDS;
    for (unsigned i = 0; i < FNV_MAX_MIG_PROFILES; i++) {
        terminate(d->mig[i].name, sizeof d->mig[i].name);
        if (d->mig[i].placement_size == 0 || d->mig[i].placement_size > 32)
            d->mig[i].placement_starts = 0; /* no placement can be described */
    }
    if (d->gfx_clock_step == 0) d->gfx_clock_min = d->max_clocks[0]; /* one clock, no loop */
}

int fnv_parse_state(const uint8_t *buf, size_t len, fnv_header *header, fnv_device **devices,
                    char *err, size_t errlen) {
    *devices = NULL;
    if (len < sizeof(fnv_header) + 4) {
        snprintf(err, errlen, "%zu bytes: truncated", len);
        return -1;
    }
    uint32_t crc;
    memcpy(&crc, buf + len - 4, 4);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION /* let the fuzzer past the CRC */
    if (fnv_crc32(buf, len - 4) != crc) {
        snprintf(err, errlen, "checksum mismatch: truncated or torn write");
        return -1;
    }
#else
    (void)crc;
#endif
    memcpy(header, buf, sizeof *header);
    if (memcmp(header->magic, FNV_STATE_MAGIC, 8) != 0 || header->version != FNV_FORMAT_VERSION ||
        header->header_size != sizeof(fnv_header) || header->device_size != sizeof(fnv_device)) {
        snprintf(err, errlen, "not a version %d fakenvml state; re-run `fakenvml init`",
                 FNV_FORMAT_VERSION);
        return -1;
    }
    if (header->device_count < 1 || header->device_count > FNV_MAX_DEVICES) {
        snprintf(err, errlen, "device count %u out of range 1-%d", header->device_count,
                 FNV_MAX_DEVICES);
        return -1;
    }
    if (len != sizeof(fnv_header) + (size_t)header->device_count * sizeof(fnv_device) + 4) {
        snprintf(err, errlen, "length %zu does not match %u devices", len, header->device_count);
        return -1;
    }
    terminate(header->driver_version, sizeof header->driver_version);
    terminate(header->nvml_version, sizeof header->nvml_version);
    terminate(header->node_name, sizeof header->node_name);
    terminate(header->driver_branch, sizeof header->driver_branch);
    fnv_device *devs = calloc(header->device_count, sizeof *devs);
    if (!devs) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    memcpy(devs, buf + sizeof(fnv_header), (size_t)header->device_count * sizeof *devs);
    for (uint32_t i = 0; i < header->device_count; i++) {
        sanitize_device(&devs[i]);
        devs[i].index = i; /* the position is the index; never trust a stored one */
    }
    *devices = devs;
    return 0;
}

/* The state directory handed over by fakenvml's persistenced (a descriptor passed over
 * its socket), as "/proc/self/fd/<n>", or NULL. The descriptor stays open for the process's
 * life: one per process, asked once. */
static const char *socket_state_dir(void) {
    static int fd = -2;
    static char path[64];
    if (fd == -2) {
        fd = -1;
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        snprintf(addr.sun_path, sizeof addr.sun_path, "%s", FNV_PERSISTENCED_SOCKET);
        struct timeval two_s = {2, 0}; /* a hung daemon must not hang nvmlInit */
        if (s >= 0 && setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &two_s, sizeof two_s) == 0 &&
            connect(s, (struct sockaddr *)&addr, sizeof addr) == 0) {
            char hello[sizeof FNV_PERSISTENCED_HELLO] = "";
            union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(int))];
            } ctl;
            struct iovec iov = {hello, sizeof hello - 1};
            struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                               .msg_controllen = sizeof ctl.buf};
            ssize_t n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
            struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&m) : NULL;
            if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
                c->cmsg_len == CMSG_LEN(sizeof(int))) {
                int got;
                memcpy(&got, CMSG_DATA(c), sizeof got);
                if (n == (ssize_t)sizeof hello - 1 && memcmp(hello, FNV_PERSISTENCED_HELLO, n) == 0)
                    fd = got;
                else
                    close(got);
            }
        }
        if (s >= 0) close(s);
        if (fd >= 0) snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    return fd >= 0 ? path : NULL;
}

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

/* The state directory: $FAKENVML_STATE_DIR; else, for a library installed in a driver root
 * (<root>/usr/lib/x86_64-linux-gnu/, as `fakenvml install-driver` lays it out), the default
 * path inside that root when it is a directory there; else the default path when it is a
 * directory; else (a workload container, which NVIDIA's CDI specs give the driver's files
 * and nvidia-persistenced's socket, not the state) what persistenced hands over, and
 * *contained is set; else the default path (nvmlInit then says it is missing). A plugin
 * whose manifest we do not write (NVIDIA's Helm chart: no extra env or volumes) mounts only
 * the driver root, so the state has to be found through it, as every other driver file is. */
static const char *state_dir(char *buf, size_t size, int *contained) {
    *contained = 0;
    const char *dir = getenv(FNV_STATE_DIR_ENV);
    if (dir && *dir) return dir;
    Dl_info info;
    if (dladdr((void *)state_dir, &info) && info.dli_fname) {
        const char *slash = strrchr(info.dli_fname, '/');
        const size_t lib_len = strlen(FNV_DRIVER_LIB_DIR);
        /* dir_len > lib_len: a root other than "/" (there the default path is the same) */
        size_t dir_len = slash ? (size_t)(slash - info.dli_fname) + 1 : 0;
        if (dir_len > lib_len && memcmp(slash + 1 - lib_len, FNV_DRIVER_LIB_DIR, lib_len) == 0) {
            int n = snprintf(buf, size, "%.*s" FNV_DEFAULT_STATE_DIR, (int)(dir_len - lib_len),
                             info.dli_fname);
            if (n > 0 && (size_t)n < size && is_dir(buf)) return buf;
        }
    }
    if (is_dir(FNV_DEFAULT_STATE_DIR)) return FNV_DEFAULT_STATE_DIR;
    const char *handed = socket_state_dir();
    if (handed) {
        *contained = 1;
        return handed;
    }
    return FNV_DEFAULT_STATE_DIR;
}

/* Whether /dev/nvidia<minor> is a character device here (a container's CDI devices). */
static int has_device_node(uint32_t minor) {
    char path[32];
    struct stat sb;
    snprintf(path, sizeof path, "/dev/nvidia%u", minor);
    return stat(path, &sb) == 0 && S_ISCHR(sb.st_mode);
}

/* st->visible / st->position: every GPU, or in a container those with their device node. */
static int set_visible(fnv_state *st) {
    st->visible = calloc(st->count, sizeof *st->visible);
    st->position = calloc(st->count, sizeof *st->position);
    if (!st->visible || !st->position) return -1;
    st->nvisible = 0;
    for (uint32_t i = 0; i < st->count; i++) {
        st->position[i] = UINT32_MAX;
        if (st->contained && !has_device_node(st->devices[i].minor)) continue;
        st->position[i] = st->nvisible;
        st->visible[st->nvisible++] = i;
    }
    return 0;
}

static int read_file(const char *path, uint8_t **out, size_t *len, char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s", strerror(errno));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (size_t)sb.st_size > FNV_MAX_STATE_BYTES) {
        snprintf(err, errlen, "not a regular file of at most %zu bytes", FNV_MAX_STATE_BYTES);
        close(fd);
        return -1;
    }
    size_t size = (size_t)sb.st_size, got = 0;
    uint8_t *buf = malloc(size ? size : 1);
    while (buf && got < size) {
        ssize_t n = read(fd, buf + got, size - got);
        if (n <= 0) break; /* shrunk under us: the checksum will say so */
        got += (size_t)n;
    }
    close(fd);
    if (!buf) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    *out = buf;
    *len = got;
    return 0;
}

static int open_journal(fnv_state *st, char *err, size_t errlen) {
    int fd = open(st->journal_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", st->journal_path, strerror(errno));
        return -1;
    }
    fnv_journal_header jh;
    if (pread(fd, &jh, sizeof jh, 0) != (ssize_t)sizeof jh || memcmp(jh.magic, FNV_JOURNAL_MAGIC, 8) ||
        jh.version != FNV_JOURNAL_VERSION || jh.record_size != sizeof(fnv_record)) {
        snprintf(err, errlen, "%s: not a fakenvml journal", st->journal_path);
        close(fd);
        return -1;
    }
    if (jh.boot_id != st->header.boot_id) {
        snprintf(err, errlen, "%s belongs to another init", st->journal_path);
        close(fd);
        return -2; /* a concurrent `fakenvml init` between its two renames: retry */
    }
    st->journal_fd = fd;
    return 0;
}

nvmlReturn_t fnv_load(fnv_state **out) {
    char err[PATH_MAX + 128] = "";
    fnv_state *st = calloc(1, sizeof *st);
    if (!st) return NVML_ERROR_MEMORY;
    st->journal_fd = -1;
    char found[PATH_MAX];
    const char *dir = state_dir(found, sizeof found, &st->contained);
    char path[PATH_MAX];
    snprintf(st->dir, sizeof st->dir, "%s", dir);
    snprintf(path, sizeof path, "%s/" FNV_STATE_FILE, dir);
    snprintf(st->journal_path, sizeof st->journal_path, "%s/" FNV_JOURNAL_FILE, dir);
    for (int attempt = 0; attempt < 20; attempt++) {
        uint8_t *buf;
        size_t len;
        if (read_file(path, &buf, &len, err, sizeof err) != 0) {
            fnv_log("nvmlInit: %s: %s (run `fakenvml init`)", path, err);
            free(st);
            return NVML_ERROR_DRIVER_NOT_LOADED;
        }
        free(st->devices);
        int rc = fnv_parse_state(buf, len, &st->header, &st->devices, err, sizeof err);
        free(buf);
        if (rc == 0) rc = open_journal(st, err, sizeof err);
        if (rc == 0) break;
        if (rc == -2) {
            nanosleep(&(struct timespec){0, 5 * 1000 * 1000}, NULL);
            continue;
        }
        fnv_log("nvmlInit: %s: %s", path, err);
        free(st->devices);
        free(st);
        return NVML_ERROR_UNKNOWN;
    }
    if (st->journal_fd < 0) {
        fnv_log("nvmlInit: %s", err);
        free(st->devices);
        free(st);
        return NVML_ERROR_UNKNOWN;
    }
    st->count = st->header.device_count;
    st->faults = calloc(st->count, sizeof *st->faults);
    st->live = calloc(st->count, sizeof *st->live);
    st->mig = calloc(st->count, sizeof *st->mig);
    if (!st->faults || !st->live || !st->mig || set_visible(st) != 0) {
        fnv_free(st);
        return NVML_ERROR_MEMORY;
    }
    *out = st;
    return NVML_SUCCESS;
}

void fnv_free(fnv_state *st) {
    if (!st) return;
    if (st->journal_fd >= 0) close(st->journal_fd);
    if (st->gen) munmap((void *)st->gen, sizeof *st->gen);
    if (st->counters)
        munmap((char *)st->counters - sizeof(fnv_counters),
               sizeof(fnv_counters) + (size_t)st->counter_slots * sizeof(fnv_counter));
    free(st->devices);
    free(st->faults);
    if (st->live)
        for (uint32_t i = 0; i < st->count; i++) free(st->live[i].procs);
    free(st->live);
    free(st->mig);
    free(st->visible);
    free(st->position);
    free(st);
}
