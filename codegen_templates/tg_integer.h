// Included by native_helpers.h and cuda_kernels.cu.j2.  An integer's abs,
// fmax, fmin and fmod in its own type (cstyle.integer_math prints these for
// the registry's fabs, fmax, fmin and fmod of an integer): C's and CUDA's go
// through double, which holds 53 bits, so np.abs of an int64 above 2**53
// came out rounded.  abs of the most negative value is that value, as NumPy gives it.
#ifndef TG_INTEGER_HELPERS
#define TG_INTEGER_HELPERS
#ifdef __cplusplus
// CUDA and its emulator (no -fwrapv there): the negation in unsigned
// arithmetic, so no signed overflow for the compiler to assume away
#ifndef TG_INT_QUAL
#define TG_INT_QUAL static inline
#endif
TG_INT_QUAL long long tg_iabs(long long a) { return a < 0 ? (long long)(0ULL - (unsigned long long)a) : a; }
TG_INT_QUAL int tg_iabs(int a) { return a < 0 ? (int)(0U - (unsigned int)a) : a; }
TG_INT_QUAL short tg_iabs(short a) { return a < 0 ? (short)(0U - (unsigned int)a) : a; }
TG_INT_QUAL signed char tg_iabs(signed char a) { return a < 0 ? (signed char)(0U - (unsigned int)a) : a; }
#else
// C: built with -fwrapv, signed integers wrap
#define tg_iabs(a) ((a) < 0 ? -(a) : (a))
#endif
// np.fmod of integers: C's truncated %, 0 for a zero divisor (as NumPy),
// and 0 for -1 (the most negative value's % -1 traps on x86)
#define tg_ifmod(a, b) ((b) == 0 || (b) == -1 ? 0 : (a) % (b))
#define tg_ufmod(a, b) ((b) == 0 ? 0 : (a) % (b))
#define tg_imax(a, b) ((a) > (b) ? (a) : (b))
#define tg_imin(a, b) ((a) < (b) ? (a) : (b))
#endif
