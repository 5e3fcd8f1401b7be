/* libcuda.so.1 of the fake driver: the CUDA driver API's entry points answer as on a
 * machine whose driver sees no usable GPU. It exists because real driver roots have
 * libcuda.so.<version>, and what writes CDI specs (nvidia-ctk, NVIDIA's plugin) finds
 * the driver's library directory and version by it. No CUDA header is used: the two
 * result codes are CUDA's documented values. */
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100

int cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_ERROR_NO_DEVICE;
}

int cuDeviceGetCount(int *count) {
    (void)count;
    return CUDA_ERROR_NOT_INITIALIZED; /* cuInit never succeeded */
}
