// tracegrad's CUDA emulator header (used by tracegrad.testing, never by the
// product): with it, the host C++ compiler builds a generated CUDA
// translation unit UNCHANGED, so tests can run our kernels on the CPU.
//
// It defines what the kernels use of CUDA: the qualifiers (__global__,
// __device__, __restrict__), the grid indices (threadIdx, blockIdx,
// blockDim, gridDim: thread-local globals that the launcher sets before
// calling the kernel for each thread of the grid), the bit-pattern
// intrinsics, and the device math functions <cmath> lacks.  Everything else
// comes from <cmath>.  It deliberately does NOT define __syncthreads,
// __shared__, warp shuffles or atomics: a kernel that needs threads to run
// concurrently cannot be emulated by running them one after another, so
// such a kernel fails to compile here instead of passing by accident.
#pragma once
#include <cmath>
#include <math.h>
#include <cstring>
#include <cstddef>
#include <utility>
#include <type_traits>
// NVRTC, which builds the kernels on a GPU, has no <math.h>: a kernel naming
// its macros must fail here too, not pass on the CPU and fail on the device.
#undef INFINITY
#undef NAN
#undef HUGE_VAL
#undef HUGE_VALF

struct dim3 {
    unsigned int x, y, z;
};

static thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict

static inline float __int_as_float(unsigned int i) {
    float f;
    std::memcpy(&f, &i, sizeof f);
    return f;
}

static inline double __longlong_as_double(unsigned long long i) {
    double d;
    std::memcpy(&d, &i, sizeof d);
    return d;
}

// CUDA device math functions missing from <cmath>
static inline float rsqrt(float x) { return 1.0f / std::sqrt(x); }
static inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
static inline float sinpi(float x) { return std::sin(3.14159265358979323846f * x); }
static inline double sinpi(double x) { return std::sin(3.14159265358979323846 * x); }
static inline float cospi(float x) { return std::cos(3.14159265358979323846f * x); }
static inline double cospi(double x) { return std::cos(3.14159265358979323846 * x); }

// The launcher: runs kernel k for every thread of the grid, one after the
// other.  args is the CUDA driver API's kernelParams: one pointer per
// parameter, to that parameter's value.
template <typename... A, std::size_t... I>
static inline void tg_emu_invoke(void (*k)(A...), void** args, std::index_sequence<I...>) {
    k(*static_cast<typename std::remove_cv<A>::type*>(args[I])...);
}

template <typename... A>
static void tg_emu_launch(void (*k)(A...), const unsigned int* grid, const unsigned int* block,
                          void** args) {
    gridDim = dim3{grid[0], grid[1], grid[2]};
    blockDim = dim3{block[0], block[1], block[2]};
    for (unsigned int bz = 0; bz < grid[2]; ++bz)
        for (unsigned int by = 0; by < grid[1]; ++by)
            for (unsigned int bx = 0; bx < grid[0]; ++bx) {
                blockIdx = dim3{bx, by, bz};
                for (unsigned int tz = 0; tz < block[2]; ++tz)
                    for (unsigned int ty = 0; ty < block[1]; ++ty)
                        for (unsigned int tx = 0; tx < block[0]; ++tx) {
                            threadIdx = dim3{tx, ty, tz};
                            tg_emu_invoke(k, args, std::index_sequence_for<A...>{});
                        }
            }
}
