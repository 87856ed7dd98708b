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

{% include "tg_integer.h" %}

#define TG_POLY_QUAL static inline
#define TG_UNROLL_10 _Pragma("GCC unroll 10")
{% include "tg_polygamma.h" %}
// a literal n == 0 (digamma, gammaln's gradient) folds to the loop-free
// tg_digamma here, so a vector loop inlines it
#define tg_polygamma(x, n) ((n) == 0 ? tg_digamma(x) : tg_polygamma(x, n))

// Floor division and remainder as NumPy computes them (Python's // and %);
// integer division by zero gives 0, as in NumPy (which also warns); the
// most negative value over -1 wraps to itself (x86's division traps there:
// SIGFPE killed the interpreter).
#define TG_INT_DIVMOD(T, N) \
static inline T tg_floordiv_##N(T a, T b) { \
    if (b == 0) return 0; \
    if ((T)-1 < 0 && b == (T)-1) return (T)(0ULL - (unsigned long long)a); \
    T q = a / b; \
    return (a % b != 0 && ((a % b < 0) != (b < 0))) ? q - 1 : q; } \
static inline T tg_remainder_##N(T a, T b) { \
    if (b == 0 || ((T)-1 < 0 && b == (T)-1)) return 0; \
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
// blocks of TG_BLOCK for loops with fused sums (one parallel loop a round).
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
#define TG_PBLOCK 4096LL
#define TG_ROUND 4096LL
// The threads of a loop take one block of TG_PBLOCK elements, or TG_CHUNK
// blocks of TG_BLOCK, at a time (a dynamic schedule: a thread the system
// deschedules delays the loop's end by one chunk, where a static split waits
// for its whole share), and at most TG_THREADS(m) threads run it, m from its
// size (codegen.py's thread_count: each thread gets at least the work that
// pays for waking it)
#define TG_CHUNK 16
#define TG_THREADS(m) ((m) < TG_NUM_THREADS ? (m) : TG_NUM_THREADS)
// on one thread (backing off, below) the whole loop is one chunk: no call
// into the OpenMP runtime per chunk
#define TG_CHUNK_OF(nt, c) ((nt) > 1 ? (c) : (1 << 30))
// Threads only where they pay, measured as the program runs: each threaded
// kernel keeps its last times on one thread and on its threads (smoothed) and
// runs the faster way; now and then it tries the other way again (soon after
// a try that changed the choice, twice as late after each that did not, up
// to TG_TRY_MAX ns).  Where other processes hold the cores, a woken thread can
// wait a whole time slice (20 ms for a 0.1 ms kernel, docs/native.md,
// Threads) and the loop's end waits for it: such a kernel then runs on the
// calling thread.  The choice changes only the time, never a result.
#define TG_TRY_MIN 1000000LL
#define TG_TRY_MAX 2000000000LL
typedef struct { long long ns[2], next_try, gap; int trying, warm; } tg_par;
#ifdef _OPENMP
#include <time.h>
#define TG_LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define TG_ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
static inline long long tg_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}
// the threads for this call: m (at most TG_NUM_THREADS) or 1; *t0: its start
static inline int tg_par_threads(tg_par* p, int m, long long* t0)
{
    if (tg_forked || m < 2) {                      // (tg_par_done reads no time then)
        *t0 = 0;
        return 1;
    }
    const long long now = tg_now_ns();
    *t0 = now;
#ifdef TG_PAR_FIXED
    return m;                                      // (measurements: always the threads)
#endif
    if (!TG_LD(p->warm))
        return m;                                  // the first call starts the threads
    const long long solo = TG_LD(p->ns[0]), par = TG_LD(p->ns[1]);
    int threads = !par || (solo && par <= solo);   // untried, or the faster
    const int trying = par && solo && now >= TG_LD(p->next_try);
    if (trying)
        threads = !threads;                        // now and then the other way
    TG_ST(p->trying, trying);
    return threads ? m : 1;
}
static inline void tg_par_done(tg_par* p, int m, int nt, long long t0)
{
    if (tg_forked || m < 2)
        return;
    if (!TG_LD(p->warm)) {                         // (its time is not the kernel's)
        TG_ST(p->warm, 1);
        return;
    }
    const long long now = tg_now_ns(), t = now - t0;
    const int k = nt > 1, trying = TG_LD(p->trying);
    const int before = TG_LD(p->ns[1]) <= TG_LD(p->ns[0]);
    const long long old = TG_LD(p->ns[k]);
    TG_ST(p->ns[k], !old || trying ? t : (old + t) / 2);
    const long long solo = TG_LD(p->ns[0]), par = TG_LD(p->ns[1]);
    if (!solo || !par || (!trying && TG_LD(p->next_try)))
        return;
    long long gap = TG_LD(p->gap), base = 100 * (solo < par ? solo : par);
    base = base < TG_TRY_MIN ? TG_TRY_MIN : base > TG_TRY_MAX ? TG_TRY_MAX : base;
    if (!trying || (par <= solo) != before)
        gap = base;                                 // the first choice, or a changed one
    else
        gap = 2 * gap < TG_TRY_MAX ? 2 * gap : TG_TRY_MAX;
    TG_ST(p->gap, gap);
    TG_ST(p->next_try, now + gap);
}
#else
#define tg_par_threads(p, m, t0) ((void)(p), *(t0) = 0, 1)
#define tg_par_done(p, m, nt, t0) ((void)(p), (void)(t0))
#endif
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
