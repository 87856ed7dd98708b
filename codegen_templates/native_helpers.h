// Helpers the C expressions of the registry call (included in a generated
// native C file by native_kernels.c.j2).  The registry's expressions are
// written for CUDA's overloaded C++ math; C dispatches on type with _Generic.
#ifndef TG_NATIVE_HELPERS
#define TG_NATIVE_HELPERS
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

// the bit-pattern literals tracegrad prints for NaN and infinities
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, sizeof f); return f; }
static inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, sizeof f); return f; }
static inline double tg_rsqrt(double x) { return 1.0 / sqrt(x); }
static inline float tg_rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double tg_sinpi(double x) { return sin(M_PI * x); }
static inline float tg_sinpif(float x) { return (float)sin(M_PI * (double)x); }
#define rsqrt(x) tg_rsqrt(x)
#define rsqrtf(x) tg_rsqrtf(x)
#define sinpi(x) tg_sinpi(x)
#define sinpif(x) tg_sinpif(x)

// fmax and fmin as NumPy's array loops compute them (the NaN operand loses;
// on a tie, signed zeros included, the second operand wins), written as a
// compare and select that the vector loop inlines: C's fmax is a libm call
// per element, which gcc does not vectorise without -ffinite-math-only (it
// kept np.fmax, and logaddexp's loop with its exp and log1p, scalar).
// codegen.py's _c_math calls these for floating operands.
static inline double tg_fmax(double a, double b) { return (a > b || isnan(b)) ? a : b; }
static inline float tg_fmaxf(float a, float b) { return (a > b || isnan(b)) ? a : b; }
static inline double tg_fmin(double a, double b) { return (a < b || isnan(b)) ? a : b; }
static inline float tg_fminf(float a, float b) { return (a < b || isnan(b)) ? a : b; }

// Floor division and remainder as NumPy computes them (Python's // and %);
// integer division by zero gives 0, as in NumPy (which also warns).
#define TG_INT_DIVMOD(T, N) \
static inline T tg_floordiv_##N(T a, T b) { \
    if (b == 0) return 0; \
    T q = a / b; \
    return (a % b != 0 && ((a % b < 0) != (b < 0))) ? q - 1 : q; } \
static inline T tg_remainder_##N(T a, T b) { \
    if (b == 0) return 0; \
    T r = a % b; \
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
TG_INT_DIVMOD(signed char, i8)
TG_INT_DIVMOD(unsigned char, u8)
TG_INT_DIVMOD(short, i16)
TG_INT_DIVMOD(unsigned short, u16)
TG_INT_DIVMOD(int, i32)
TG_INT_DIVMOD(unsigned int, u32)
TG_INT_DIVMOD(long long, i64)
TG_INT_DIVMOD(unsigned long long, u64)
#define TG_FLOAT_DIVMOD(F, N, FMOD, FLOOR, COPYSIGN) \
static inline F tg_floordiv_##N(F a, F b) { \
    if (b == 0) return a / b; \
    F mod = FMOD(a, b); \
    F div = (a - mod) / b; \
    if (mod != 0 && ((b < 0) != (mod < 0))) div -= 1; \
    if (div == 0) return COPYSIGN((F)0, a / b); \
    F fl = FLOOR(div); \
    return (div - fl > (F)0.5) ? fl + 1 : fl; } \
static inline F tg_remainder_##N(F a, F b) { \
    if (b == 0) return FMOD(a, b); \
    F mod = FMOD(a, b); \
    if (mod != 0) return ((b < 0) != (mod < 0)) ? mod + b : mod; \
    return COPYSIGN((F)0, b); }
TG_FLOAT_DIVMOD(float, f32, fmodf, floorf, copysignf)
TG_FLOAT_DIVMOD(double, f64, fmod, floor, copysign)
#define TG_DISPATCH(NAME, a, b) _Generic((a), \
    signed char: NAME##_i8, unsigned char: NAME##_u8, short: NAME##_i16, \
    unsigned short: NAME##_u16, int: NAME##_i32, unsigned int: NAME##_u32, \
    long long: NAME##_i64, unsigned long long: NAME##_u64, \
    float: NAME##_f32, double: NAME##_f64)((a), (b))
#define tg_floordiv(a, b) TG_DISPATCH(tg_floordiv, a, b)
#define tg_remainder(a, b) TG_DISPATCH(tg_remainder, a, b)

// Sums of a fused reduction: each block of TG_BLOCK elements is summed by
// the vector loop, the block sums pairwise (a binary counter of partial
// sums), so the rounding error grows like NumPy's pairwise sum, not like a
// sequential one.
#define TG_BLOCK 256LL
// Threaded kernels: TG_NUM_THREADS (set by the recipe with -fopenmp), blocks
// of TG_PBLOCK elements for plain elementwise loops, rounds of TG_ROUND
// blocks of TG_BLOCK for loops with fused sums.
#ifndef TG_NUM_THREADS
#define TG_NUM_THREADS 1
#endif
// GNU OpenMP's threads do not survive fork(): a child process that entered a
// parallel region would wait for them forever, so after a fork the child runs
// every kernel on its calling thread (the parallel regions' if clause).
static int tg_forked = 0;
#ifdef _OPENMP
#include <pthread.h>
static void tg_after_fork_child(void) { tg_forked = 1; }
__attribute__((constructor)) static void tg_register_fork(void)
{
    pthread_atfork(NULL, NULL, tg_after_fork_child);
}
#endif
#define TG_PBLOCK 2048LL
#define TG_ROUND 1024LL
#define TG_PAIRWISE(T, N) \
typedef struct { T s[64]; int level[64]; int n; } tg_pw_##N; \
static inline void tg_pw_push_##N(tg_pw_##N* p, T x) { \
    int l = 0; \
    while (p->n > 0 && p->level[p->n - 1] == l) { x = p->s[--p->n] + x; l++; } \
    p->s[p->n] = x; p->level[p->n++] = l; } \
static inline T tg_pw_done_##N(tg_pw_##N* p) { \
    T x = 0; \
    while (p->n > 0) x = p->s[--p->n] + x; \
    return x; }
TG_PAIRWISE(float, f32)
TG_PAIRWISE(double, f64)
#endif  // TG_NATIVE_HELPERS
