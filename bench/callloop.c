/* A C caller of any libnvidia-ml: the call-path benchmark (`make bench`, also run against
 * a peer fake given by path) and the no-system-call test (tests/fakenvml/test_call_path.py).
 *
 *   callloop LIB GPUS CALLS           ns per call of two getters, one line each; GPUS 0:
 *                                     every GPU the library has
 *   callloop LIB GPUS CALLS --phases  CALLS getter calls, a line read from stdin (the test
 *                                     injects meanwhile), one call, CALLS calls; getppid()
 *                                     marks the phases for strace.
 *
 * Only the few NVML declarations it needs, by their documented ABI, so that it loads any
 * library (ours, a peer's) without a header. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct nvmlDevice_st *dev_t_;
typedef struct {
    unsigned long long total, free, used;
} mem_t;
typedef int (*init_f)(void);
typedef int (*count_f)(unsigned *);
typedef int (*handle_f)(unsigned, dev_t_ *);
typedef int (*mem_f)(dev_t_, mem_t *);
typedef int (*uuid_f)(dev_t_, char *, unsigned);

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "callloop: %s: no %s\n", dlerror(), name);
        exit(2);
    }
    return p;
}

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: callloop LIB GPUS CALLS [--phases]\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "callloop: %s\n", dlerror());
        return 2;
    }
    unsigned gpus = (unsigned)atoi(argv[2]);
    long calls = atol(argv[3]);
    init_f init = (init_f)sym(lib, "nvmlInit_v2");
    handle_f handle = (handle_f)sym(lib, "nvmlDeviceGetHandleByIndex_v2");
    mem_f mem = (mem_f)sym(lib, "nvmlDeviceGetMemoryInfo");
    uuid_f uuid = (uuid_f)sym(lib, "nvmlDeviceGetUUID");
    if (init() != 0) {
        fprintf(stderr, "callloop: nvmlInit_v2 failed\n");
        return 1;
    }
    if (gpus == 0 && ((count_f)sym(lib, "nvmlDeviceGetCount_v2"))(&gpus) != 0) return 1;
    dev_t_ *h = calloc(gpus ? gpus : 1, sizeof *h);
    for (unsigned i = 0; i < gpus; i++)
        if (handle(i, &h[i]) != 0) {
            fprintf(stderr, "callloop: no GPU %u\n", i);
            return 1;
        }
    mem_t m;
    char buf[96];
    int failed = 0;
    if (argc > 4 && strcmp(argv[4], "--phases") == 0) {
        getppid();
        for (long i = 0; i < calls; i++) failed |= mem(h[i % gpus], &m);
        getppid();
        if (!fgets(buf, sizeof buf, stdin)) return 1;
        getppid();
        int first = mem(h[0], &m);
        getppid();
        for (long i = 0; i < calls; i++) mem(h[i % gpus], &m);
        getppid();
        printf("before=%d first=%d\n", failed, first);
        return 0;
    }
    double t0 = now_ns();
    for (long i = 0; i < calls; i++) failed |= mem(h[i % gpus], &m);
    double t1 = now_ns();
    for (long i = 0; i < calls; i++) failed |= uuid(h[i % gpus], buf, sizeof buf);
    double t2 = now_ns();
    printf("nvmlDeviceGetMemoryInfo %.1f\nnvmlDeviceGetUUID %.1f\n", (t1 - t0) / calls,
           (t2 - t1) / calls);
    return failed ? 1 : 0;
}
