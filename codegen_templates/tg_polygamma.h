// Included by native_helpers.h and cuda_helpers.cuh (through the code
// generator's templates), each defining TG_POLY_QUAL: static inline in C,
// __device__ __forceinline__ in CUDA.  NVRTC has no <math.h>: infinities and
// NaN are the bit-pattern intrinsics both headers provide, never INFINITY/NAN.
// The n-th derivative of digamma (n == 0: digamma itself), the registry's
// polygamma row, as tracegrad.ops.runtime_numpy._polygamma computes it:
// reflection below 0.5 (n == 0), the recurrence up to 10 + 2n, then the
// asymptotic series with Bernoulli numbers B_2k, k = 1..10.
// Digamma alone, the n == 0 case below written without a branch or a loop
// of variable length (selects and a fixed ten steps: the recurrence runs
// while z < 10, and z >= 0.5 after the reflection), so that a C vector loop
// inlines it (gcc vectorises it with libmvec's tan and log): the same
// operations, in the same order, as the loop it replaces.
// (TG_UNROLL_10: native_helpers.h's gcc pragma; NVCC unrolls such loops itself)
#ifndef TG_UNROLL_10
#define TG_UNROLL_10
#endif
TG_POLY_QUAL double tg_digamma(double x) {
    const double b2k[10] = {1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66,
                            -691.0 / 2730, 7.0 / 6, -3617.0 / 510, 43867.0 / 798,
                            -174611.0 / 330};
    const bool reflect = x < 0.5;
    const double head = reflect ? -M_PI / tan(M_PI * x) : 0.0;
    double z = reflect ? 1.0 - x : x;
    // the sum of 1/z over the steps as one fraction: one division (z >= 0.5
    // here, at most 10 steps: no overflow, no cancellation)
    double num = 0.0, den = 1.0;
    TG_UNROLL_10
    for (int j = 0; j < 10; j++) {
        const bool step = z < 10.0;
        num = step ? num * z + den : num;
        den = step ? den * z : den;
        z = step ? z + 1.0 : z;
    }
    const double r = 1.0 / z, r2 = r * r;
    double s = log(z) - 0.5 * r, p = 1.0;
    TG_UNROLL_10
    for (int k = 1; k <= 10; k++) {
        p *= r2;
        s -= b2k[k - 1] / (2 * k) * p;
    }
    const double out = (head - num / den) + s;
    // SciPy: -inf at 0, nan at -1, -2, ... and at -inf; nan at nan
    const double pole = x == 0.0 ? __longlong_as_double(0xfff0000000000000LL)
                                 : __longlong_as_double(0x7ff8000000000000LL);
    return (reflect && x == floor(x)) ? pole : isnan(x) ? x : out;
}

TG_POLY_QUAL double tg_polygamma(double x, long long n) {
    const double b2k[10] = {1.0 / 6, -1.0 / 30, 1.0 / 42, -1.0 / 30, 5.0 / 66,
                            -691.0 / 2730, 7.0 / 6, -3617.0 / 510, 43867.0 / 798,
                            -174611.0 / 330};
    if (n == 0) return tg_digamma(x);
    double out = 0.0, z = x;
    if (!(z > -1e4)) return __longlong_as_double(0x7ff8000000000000LL);   // nan, -inf, too far left for the recurrence
    if (n > 0 && isinf(z)) return 0.0;
    double fact = 1.0;   // n!
    for (long long j = 2; j <= n; j++) fact *= (double)j;
    const double sgn = (n % 2) ? 1.0 : -1.0;   // (-1)^(n+1)
    const double lim = 10.0 + 2.0 * (double)n;
    while (z < lim) {
        out += sgn * fact / pow(z, (double)(n + 1));
        z += 1.0;
    }
    const double r = 1.0 / z, r2 = r * r;
    double p = pow(r, (double)n);
    double s = fact / (double)n * p + 0.5 * fact * pow(r, (double)(n + 1));
    for (int k = 1; k <= 10; k++) {
        double c = 1.0;   // (2k + n - 1)! / (2k)!
        for (long long j = 2 * k + 1; j <= 2 * k + n - 1; j++) c *= (double)j;
        p *= r2;
        s += b2k[k - 1] * c * p;
    }
    return out + sgn * s;
}
