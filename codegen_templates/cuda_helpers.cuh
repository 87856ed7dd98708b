// Device helpers the CUDA expressions of the registry call (included in
// a generated kernel file by cuda_kernels.cu.j2 when a kernel calls one).
#ifndef TG_CUDA_HELPERS
#define TG_CUDA_HELPERS
// Floor division and remainder as NumPy computes them (Python's // and %):
// C's integer / and % truncate towards zero, and floor(a / b) of floats
// misses NumPy's divmod rounding.  Integer division by zero gives 0, as in
// NumPy (which also warns).
template <typename T>
__device__ __forceinline__ T tg_floordiv(T a, T b) {
    if (b == 0) return 0;
    // the most negative value over -1 wraps to itself, as in NumPy (the
    // division overflows: it traps on x86, the emulator's host)
    if ((T)-1 < 0 && b == (T)-1) return (T)(0ULL - (unsigned long long)a);
    T q = a / b;
    return (a % b != 0 && ((a % b < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T>
__device__ __forceinline__ T tg_remainder(T a, T b) {
    if (b == 0 || ((T)-1 < 0 && b == (T)-1)) return 0;
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename F>
__device__ __forceinline__ F tg_floordiv_float(F a, F b) {
    if (b == 0) return a / b;
    F mod = fmod(a, b);
    F div = (a - mod) / b;
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1;
    if (div == 0) return copysign((F)0, a / b);
    F fl = floor(div);
    return (div - fl > (F)0.5) ? fl + 1 : fl;
}
template <typename F>
__device__ __forceinline__ F tg_remainder_float(F a, F b) {
    if (b == 0) return fmod(a, b);
    F mod = fmod(a, b);
    if (mod != 0) return ((b < 0) != (mod < 0)) ? mod + b : mod;
    return copysign((F)0, b);
}
__device__ __forceinline__ float tg_floordiv(float a, float b) { return tg_floordiv_float(a, b); }
__device__ __forceinline__ double tg_floordiv(double a, double b) { return tg_floordiv_float(a, b); }
__device__ __forceinline__ float tg_remainder(float a, float b) { return tg_remainder_float(a, b); }
__device__ __forceinline__ double tg_remainder(double a, double b) { return tg_remainder_float(a, b); }
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
#define TG_POLY_QUAL __device__ __forceinline__
{% include "tg_polygamma.h" %}
#endif  // TG_CUDA_HELPERS
