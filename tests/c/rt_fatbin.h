/* Registers one PTX kernel with the CUDA runtime the way nvcc's generated code does
 * (__cudaRegisterFatBinary, __cudaRegisterFunction, __cudaRegisterFatBinaryEnd), for the test
 * programs that launch through the runtime's own path (cudaLaunchKernel) without nvcc.
 *
 * The fat binary is a 16-byte container header (0xBA55ED50), one 64-byte entry header (PTX,
 * sm_52, 64-bit) and the PTX text padded to 8 bytes, inside the 0x466243B1 wrapper the runtime
 * is handed. `stub` is the host-side function whose address keys the kernel in the runtime.
 * One registration per program (the buffers are static); PTX up to 511 bytes.
 */
#ifndef RT_FATBIN_H
#define RT_FATBIN_H

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

extern void **__cudaRegisterFatBinary(void *fat);
extern void __cudaRegisterFatBinaryEnd(void **handle);
extern void __cudaRegisterFunction(void **handle, const char *host, char *device, const char *name, int limit,
                                   uint3 *tid, uint3 *bid, dim3 *block, dim3 *grid, int *warp);
extern void __cudaUnregisterFatBinary(void **handle);

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
} __attribute__((aligned(8))) rt_fatbin;

static struct {
    uint32_t magic, version;
    const void *data;
    void *unused;
} __attribute__((aligned(8))) rt_wrapper;

/* Registers kernel `name` of `ptx` (NUL-terminated) keyed by `stub`; returns the handle, or NULL
 * when the PTX does not fit. */
static void **register_ptx_kernel(const char *ptx, const void *stub, const char *name) {
    size_t len = strlen(ptx) + 1; /* with its NUL */
    size_t padded = (len + 7) & ~(size_t)7;
    if (padded > sizeof rt_fatbin.payload) return NULL;
    rt_fatbin.magic = 0xBA55ED50u;
    rt_fatbin.version = 1;
    rt_fatbin.header_size = 16;
    rt_fatbin.fat_size = sizeof rt_fatbin.entry + padded;
    rt_fatbin.entry.kind = 1; /* PTX */
    rt_fatbin.entry.unknown1 = 0x0101;
    rt_fatbin.entry.header_size = sizeof rt_fatbin.entry;
    rt_fatbin.entry.size = padded;
    rt_fatbin.entry.minor = 0;
    rt_fatbin.entry.major = 8;
    rt_fatbin.entry.arch = 52;
    rt_fatbin.entry.flags = 0x1; /* 64-bit */
    rt_fatbin.entry.decompressed_size = 0;
    memcpy(rt_fatbin.payload, ptx, len);
    rt_wrapper.magic = 0x466243b1u;
    rt_wrapper.version = 1;
    rt_wrapper.data = &rt_fatbin;
    void **handle = __cudaRegisterFatBinary(&rt_wrapper);
    __cudaRegisterFunction(handle, (const char *)stub, (char *)name, name, -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(handle);
    return handle;
}

#endif
