// Included by native_helpers.h and cuda_helpers.cuh (through the code
// generator's templates), each defining TG_POLY_QUAL: static inline in C,
// __device__ __forceinline__ in CUDA.  NVRTC has no <math.h>: infinities and
// NaN are the bit-pattern intrinsics both headers provide, never INFINITY/NAN.
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
        if (z == floor(z))   // SciPy: -inf at 0, nan at -1, -2, ...
            return z == 0.0 ? __longlong_as_double(0xfff0000000000000LL)
                            : __longlong_as_double(0x7ff8000000000000LL);
        out = -M_PI / tan(M_PI * z);
        z = 1.0 - z;
    }
    if (!(z > -1e4)) return __longlong_as_double(0x7ff8000000000000LL);   // nan, -inf, too far left for the recurrence
    if (n > 0 && isinf(z)) return 0.0;
    double fact = 1.0;   // n!
    for (long long j = 2; j <= n; j++) fact *= (double)j;
    const double sgn = (n % 2) ? 1.0 : -1.0;   // (-1)^(n+1)
    const double lim = 10.0 + 2.0 * (double)n;
    if (n == 0) {
        // the sum of 1/z over the steps as one fraction: one division (z >= 0.5
        // here, at most 10 steps: no overflow, no cancellation)
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
            double c = 1.0;   // (2k + n - 1)! / (2k)!
            for (long long j = 2 * k + 1; j <= 2 * k + n - 1; j++) c *= (double)j;
            p *= r2;
            s += b2k[k - 1] * c * p;
        }
        s = sgn * s;
    }
    return out + s;
}
