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
    T q = a / b;
    return (a % b != 0 && ((a % b < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T>
__device__ __forceinline__ T tg_remainder(T a, T b) {
    if (b == 0) return 0;
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
// The n-th derivative of digamma (n == 0: digamma itself), the registry's
// polygamma row, as tracegrad.ops.runtime_numpy._polygamma computes it:
// reflection below 0.5 (n == 0), the recurrence up to 10 + 2n, then the
// asymptotic series with Bernoulli numbers B_2k, k = 1..10.
TG_POLY_QUAL double tg_polygamma(double x, long long n) {
    const double b2k[10] = {1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66,
                            -691.0 / 2730, 7.0 / 6, -3617.0 / 510, 43867.0 / 798,
                            -174611.0 / 330};
    double out = 0.0, z = x;
    if (n == 0 && z < 0.5) {
        if (z == floor(z)) return z == 0.0 ? -INFINITY : NAN;   /* SciPy: -inf at 0, nan at -1, -2, ... */
        out = -M_PI / tan(M_PI * z);
        z = 1.0 - z;
    }
    if (!(z > -1e4)) return NAN;      /* nan, -inf, too far left for the recurrence */
    if (n > 0 && isinf(z)) return 0.0;
    double fact = 1.0;                /* n! */
    for (long long j = 2; j <= n; j++) fact *= (double)j;
    const double sgn = (n % 2) ? 1.0 : -1.0;    /* (-1)^(n+1) */
    const double lim = 10.0 + 2.0 * (double)n;
    if (n == 0) {
        /* the sum of 1/z over the steps as one fraction: one division (z >= 0.5
           here, at most 10 steps: no overflow, no cancellation) */
        double num = 0.0, den = 1.0;
        while (z < lim) {
            num = num * z + den;
            den *= z;
            z += 1.0;
        }
        out -= num / den;
    }
    while (z < lim) {
        out += sgn * fact / pow(z, (double)(n + 1));
        z += 1.0;
    }
    const double r = 1.0 / z, r2 = r * r;
    double s, p;
    if (n == 0) {
        s = log(z) - 0.5 * r;
        p = 1.0;
        for (int k = 1; k <= 10; k++) {
            p *= r2;
            s -= b2k[k - 1] / (2 * k) * p;
        }
    } else {
        p = pow(r, (double)n);
        s = fact / (double)n * p + 0.5 * fact * pow(r, (double)(n + 1));
        for (int k = 1; k <= 10; k++) {
            double c = 1.0;           /* (2k + n - 1)! / (2k)! */
            for (long long j = 2 * k + 1; j <= 2 * k + n - 1; j++) c *= (double)j;
            p *= r2;
            s += b2k[k - 1] * c * p;
        }
        s = sgn * s;
    }
    return out + s;
}
#endif  // TG_CUDA_HELPERS
