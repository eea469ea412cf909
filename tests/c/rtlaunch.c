/* The CUDA runtime's own launch path (cudaLaunchKernel, what `<<<…>>>` compiles to), without
 * nvcc: a fat binary holding PTX is registered the way nvcc's generated code does
 * (__cudaRegisterFatBinary, __cudaRegisterFunction), then launched on every device.
 *
 *   rtlaunch
 *
 * On each device d: cudaSetDevice(d), cudaMalloc of 1 MiB, the kernel "vecAdd" launched (d+1)
 * times through cudaLaunchKernel on the default stream, cudaDeviceSynchronize, cudaFree.
 * Prints devices=N, dD.rc (the first failing call's cudaError_t, 0 if none), done=1.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "scenario.h"

extern void **__cudaRegisterFatBinary(void *fat);
extern void __cudaRegisterFatBinaryEnd(void **handle);
extern void __cudaRegisterFunction(void **handle, const char *host, char *device, const char *name, int limit,
                                   uint3 *tid, uint3 *bid, dim3 *block, dim3 *grid, int *warp);
extern void __cudaUnregisterFatBinary(void **handle);

static const char ptx[] =
    ".version 8.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry vecAdd(\n"
    "    .param .u64 a\n"
    ")\n"
    "{\n"
    "    ret;\n"
    "}\n";

/* The fat binary: a 16-byte container header, one 64-byte entry header, the PTX (padded). */
static struct {
    uint32_t magic;
    uint16_t version, header_size;
    uint64_t fat_size;
    struct {
        uint16_t kind, unknown1;
        uint32_t header_size;
        uint64_t size;
        uint32_t compressed_size, unknown2;
        uint16_t minor, major;
        uint32_t arch, name_offset, name_len;
        uint64_t flags, zero, decompressed_size;
    } entry;
    char payload[512];
} __attribute__((aligned(8))) fatbin;

static struct {
    uint32_t magic, version;
    const void *data;
    void *unused;
} __attribute__((aligned(8))) wrapper;

/* The host-side stub: its address is the kernel's key in the runtime. */
static void vecAdd(void *a) { (void)a; }

static cudaError_t on_device(int d) {
    cudaError_t e;
    if ((e = cudaSetDevice(d)) != cudaSuccess) return e;
    void *a = NULL;
    if ((e = cudaMalloc(&a, 1 << 20)) != cudaSuccess) return e;
    void *args[] = {&a};
    dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    for (int i = 0; i < d + 1; i++)
        if ((e = cudaLaunchKernel((const void *)vecAdd, grid, block, args, 0, NULL)) != cudaSuccess) return e;
    if ((e = cudaDeviceSynchronize()) != cudaSuccess) return e;
    return cudaFree(a);
}

int main(void) {
    size_t len = sizeof ptx; /* with its NUL */
    size_t padded = (len + 7) & ~(size_t)7;
    fatbin.magic = 0xBA55ED50u;
    fatbin.version = 1;
    fatbin.header_size = 16;
    fatbin.fat_size = sizeof fatbin.entry + padded;
    fatbin.entry.kind = 1; /* PTX */
    fatbin.entry.unknown1 = 0x0101;
    fatbin.entry.header_size = sizeof fatbin.entry;
    fatbin.entry.size = padded;
    fatbin.entry.minor = 0;
    fatbin.entry.major = 8;
    fatbin.entry.arch = 52;
    fatbin.entry.flags = 0x1; /* 64-bit */
    fatbin.entry.decompressed_size = 0;
    memcpy(fatbin.payload, ptx, len);
    wrapper.magic = 0x466243b1u;
    wrapper.version = 1;
    wrapper.data = &fatbin;

    void **handle = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(handle, (const char *)vecAdd, (char *)"vecAdd", "vecAdd", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(handle);

    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    kv("count.rc=%d", (int)e);
    kv("devices=%d", count);
    for (int d = 0; d < count; d++) kv("d%d.rc=%d", d, (int)on_device(d));
    __cudaUnregisterFatBinary(handle);
    kv("done=1");
    return 0;
}
