/* Fused tensor statistics: one pass over a contiguous buffer computes the extremes, the float64 sum
 * and sum of squares (the exact integer sum for integer dtypes) and the zero count; NaN/+Inf/-Inf are
 * counted afterwards in the few blocks whose sums are not finite (only those can hold any).
 *
 * Summation (the tolerance it implies is stated in msprobe/tensors/scan.py):
 *   - the data are cut into blocks of BLOCK elements at fixed offsets; inside a block each of LANES
 *     float64 lanes accumulates every LANES-th element (BLOCK / LANES = 128 terms per lane), and the
 *     lanes are added pairwise into one partial per block;
 *   - the block partials are added in block order with Neumaier's compensated summation.
 *   Blocks, not threads, fix the order of every addition, so the result does not depend on how many
 *   threads ran.
 * Two implementations of each loop give the same bits: portable C written lane by lane, so that gcc
 * vectorises it without reassociating anything (no -ffast-math: NaN and signed-zero semantics stay
 * IEEE; -ffp-contract=off: no fused multiply-add), compiled for x86-64-v4, x86-64-v3 and the baseline
 * (target_clones); and, for the float kinds and 8-bit integers, AVX-512 intrinsics, used when the
 * CPU has AVX-512.
 * Large buffers are split across POSIX threads by whole blocks, with the GIL released.
 * Plain CPython C API and the buffer protocol: nothing to build it but a C compiler (no NumPy headers,
 * no Cython); a whole call on a one-element array costs ~1 us, about what an empty Cython function
 * taking a typed memoryview costs (0.7 us measured here).
 *
 * Python API:  scan(buffer, kind, threads=1, portable=False)
 *                  -> (max, min, sum, sum_sq, nan, posinf, neginf, zero)
 *   buffer: any C-contiguous, aligned object exporting the buffer protocol, read as `kind`:
 *           'f2' float16, 'bf2' bfloat16 bits (uint16), 'f4', 'f8', 'i1'..'i8', 'u1'..'u8',
 *           'b1' bool (bytes 0/1: max = any, min = all, sum = sum_sq = number of true elements).
 *   Floats: max/min/sum/sum_sq are Python floats (max = -inf, min = +inf when every element is NaN).
 *   Integers: max/min/sum are exact Python ints, sum_sq a float; the NaN/Inf counts are 0.
 *
 *              scan_strided(buffer, kind, shape, strides, threads=1, portable=False) -> the same tuple
 *   The elements of a strided array (a transposed or sliced view) in C order, as scan() gives for
 *   their C-contiguous copy, bit for bit: each chunk of the C-order sequence (CHUNK_BLOCKS blocks)
 *   is copied into a buffer of the thread's own, reused from call to call, and reduced there by the
 *   same chunk kernel, so the data are never copied whole (no new memory to fault in per call).
 *   buffer: bytes from the element at index (0, ..., 0) to the last one (any buffer-protocol object);
 *   shape: element counts; strides: bytes between neighbours of each dimension, >= 0, multiples of
 *   the item size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define BLOCK 4096
#define LANES 32
/* fewer elements than this per thread are not worth a thread (~200 us of work per thread) */
#define MIN_PER_THREAD (1 << 20)
#define MAX_THREADS 64

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define HAVE_AVX512 1
#else
#define MULTIVERSION
#define HAVE_AVX512 0
#endif

typedef enum { K_F2, K_BF2, K_F4, K_F8, K_I1, K_I2, K_I4, K_I8, K_U1, K_U2, K_U4, K_U8, K_B1 } Kind;

typedef struct {
    double fmax, fmin;          /* float kinds */
    int64_t imax, imin;         /* signed integer kinds */
    uint64_t umax, umin;        /* unsigned integer kinds */
    __int128 isum;              /* integer kinds: exact sum */
    int64_t nan, posinf, neginf, zero;
} Part;

typedef struct {
    const char *data;
    Py_ssize_t first, count;    /* element range (first is a multiple of BLOCK) */
    Kind kind;
    int portable;               /* use the portable kernel even where AVX-512 exists */
    double *bsum, *bsq;         /* one partial per block of the whole buffer */
    Part part;
    const char *start;          /* where element `first` is, when not data + first * itemsize (a
                                   chunk gathered from strided memory); NULL otherwise */
} Job;

/* The layout of a strided array: ndim dimensions of dims[i] elements, steps[i] bytes apart (>= 0),
 * with no dimension of one element and no two dimensions that are one (see simplify_layout). */
#define MAX_DIMS 64
typedef struct {
    int ndim;
    Py_ssize_t dims[MAX_DIMS], steps[MAX_DIMS];
} Layout;

static double pairwise(double *v, int n) {   /* n is a power of two */
    for (int width = n / 2; width > 0; width /= 2)
        for (int j = 0; j < width; j++) v[j] += v[j + width];
    return v[0];
}

static inline float bf16_to_float(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float out;
    memcpy(&out, &wide, sizeof out);
    return out;
}

/* ---- floating-point kernels, portable C. FT is the type max/min are taken in (exact for the
 * element type). NaN/Inf are not counted here: see count_nonfinite. */
#define FLOAT_STEP(x, j)                                                                           \
    do {                                                                                           \
        double d = (double)(x);                                                                    \
        mx[j] = (x) > mx[j] ? (x) : mx[j];                                                         \
        mn[j] = (x) < mn[j] ? (x) : mn[j];                                                         \
        s[j] += d;                                                                                 \
        sq[j] += d * d;                                                                            \
        cz[j] += (x) == 0;                                                                         \
    } while (0)

#define FLOAT_KERNEL(NAME, CT, FT, LOAD)                                                           \
    MULTIVERSION static void NAME(const CT *p, Py_ssize_t n, double *bsum, double *bsq, Part *out) { \
        FT mx[LANES], mn[LANES];                                                                   \
        int64_t zero = 0;                                                                          \
        for (int j = 0; j < LANES; j++) { mx[j] = -INFINITY; mn[j] = INFINITY; }                  \
        for (Py_ssize_t b = 0; b * BLOCK < n; b++) {                                               \
            const CT *q = p + b * BLOCK;                                                           \
            Py_ssize_t m = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK, i = 0;                   \
            double s[LANES] = {0}, sq[LANES] = {0};                                                \
            int32_t cz[LANES] = {0};                                                               \
            for (; i + LANES <= m; i += LANES)                                                     \
                for (int j = 0; j < LANES; j++) { FT x = LOAD(q[i + j]); FLOAT_STEP(x, j); }       \
            for (int j = 0; i < m; i++, j++) { FT x = LOAD(q[i]); FLOAT_STEP(x, j); }              \
            for (int j = 0; j < LANES; j++) zero += cz[j];                                         \
            bsum[b] = pairwise(s, LANES);                                                          \
            bsq[b] = pairwise(sq, LANES);                                                          \
        }                                                                                          \
        FT hi = mx[0], lo = mn[0];                                                                 \
        for (int j = 1; j < LANES; j++) { hi = mx[j] > hi ? mx[j] : hi; lo = mn[j] < lo ? mn[j] : lo; } \
        out->fmax = (double)hi; out->fmin = (double)lo; out->zero = zero;                          \
    }

/* IEEE binary16 -> binary32, exact for every value (subnormals through the power-of-two scaling,
 * Inf and NaN payloads kept), branch-free so that it vectorises. */
static inline float f16_to_float(uint16_t h) {
    uint32_t magnitude = (uint32_t)(h & 0x7FFFu) << 13;
    float f;
    memcpy(&f, &magnitude, sizeof f);
    f *= 0x1p112f;                       /* rebias the exponent: 2^(127 - 15) */
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((h & 0x7C00u) == 0x7C00u) bits = magnitude | 0x7F800000u;  /* Inf / NaN */
    bits |= (uint32_t)(h & 0x8000u) << 16;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#define LOAD_SAME(v) (v)

FLOAT_KERNEL(generic_f4, float, float, LOAD_SAME)
FLOAT_KERNEL(generic_f8, double, double, LOAD_SAME)
FLOAT_KERNEL(generic_bf2, uint16_t, float, bf16_to_float)
FLOAT_KERNEL(generic_f2, uint16_t, float, f16_to_float)

/* ---- AVX-512 kernels of the same arithmetic: lane j of the portable kernel is element j % 8 of
 * vector j / 8 (s0..s3), and the final lane reduction is done in the same pairwise order, so
 * both give identical bits. */
#if HAVE_AVX512
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,f16c,fma,avx2")))

AVX512 static inline double lanes_pairwise(__m512d s0, __m512d s1, __m512d s2, __m512d s3) {
    s0 = _mm512_add_pd(s0, s2);                                 /* v[j] += v[j + 16] */
    s1 = _mm512_add_pd(s1, s3);
    s0 = _mm512_add_pd(s0, s1);                                 /* v[j] += v[j + 8] */
    __m256d a = _mm256_add_pd(_mm512_castpd512_pd256(s0), _mm512_extractf64x4_pd(s0, 1));  /* +4 */
    __m128d c = _mm_add_pd(_mm256_castpd256_pd128(a), _mm256_extractf128_pd(a, 1));       /* +2 */
    return _mm_cvtsd_f64(_mm_add_sd(c, _mm_unpackhi_pd(c, c)));                           /* +1 */
}

AVX512 static inline __m512 load_f4(const void *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
AVX512 static inline __m512 load_bf2(const void *p, __mmask16 m) {
    __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}
AVX512 static inline __m512 load_f2(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}

/* one vector of 16 values whose float64 halves go to lanes (lo, hi) */
#define AVX_F32_STEP(x, m, vmax, vmin, lo, hi, qlo, qhi)                                           \
    do {                                                                                           \
        vmax = _mm512_mask_max_ps(vmax, m, x, vmax);                                               \
        vmin = _mm512_mask_min_ps(vmin, m, x, vmin);                                               \
        __m512d dlo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));                                  \
        __m512d dhi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));                               \
        lo = _mm512_add_pd(lo, dlo);                                                               \
        hi = _mm512_add_pd(hi, dhi);                                                               \
        qlo = _mm512_fmadd_pd(dlo, dlo, qlo); /* squares of float32 values are exact: = mul + add */ \
        qhi = _mm512_fmadd_pd(dhi, dhi, qhi);                                                      \
        cz = _mm512_mask_add_epi32(cz, _mm512_mask_cmp_ps_mask(m, x, zeros, _CMP_EQ_OQ), cz, ones); \
    } while (0)

#define AVX_F32_KERNEL(NAME, CT, LOADV)                                                            \
    AVX512 static void NAME(const CT *p, Py_ssize_t n, double *bsum, double *bsq, Part *out) {     \
        const __m512 zeros = _mm512_setzero_ps();                                                  \
        const __m512i ones = _mm512_set1_epi32(1);                                                 \
        __m512 max0 = _mm512_set1_ps(-INFINITY), max1 = max0, min0 = _mm512_set1_ps(INFINITY), min1 = min0; \
        int64_t zero = 0;                                                                          \
        for (Py_ssize_t b = 0; b * BLOCK < n; b++) {                                               \
            const CT *q = p + b * BLOCK;                                                           \
            Py_ssize_t m = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK, i = 0;                   \
            __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0; \
            __m512i cz = _mm512_setzero_si512();                                                   \
            for (; i + LANES <= m; i += LANES) {                                                   \
                __m512 x0 = LOADV(q + i, 0xFFFF), x1 = LOADV(q + i + 16, 0xFFFF);                  \
                AVX_F32_STEP(x0, 0xFFFF, max0, min0, s0, s1, q0, q1);                              \
                AVX_F32_STEP(x1, 0xFFFF, max1, min1, s2, s3, q2, q3);                              \
            }                                                                                      \
            if (i < m) {                                                                           \
                Py_ssize_t r = m - i;                                                              \
                __mmask16 m0 = (__mmask16)(r >= 16 ? 0xFFFF : (1u << r) - 1);                      \
                __mmask16 m1 = (__mmask16)(r <= 16 ? 0 : (1u << (r - 16)) - 1);                   \
                __m512 x0 = LOADV(q + i, m0), x1 = LOADV(q + i + 16, m1);                          \
                AVX_F32_STEP(x0, m0, max0, min0, s0, s1, q0, q1);                                  \
                AVX_F32_STEP(x1, m1, max1, min1, s2, s3, q2, q3);                                  \
            }                                                                                      \
            zero += _mm512_reduce_add_epi32(cz);                                                   \
            bsum[b] = lanes_pairwise(s0, s1, s2, s3);                                              \
            bsq[b] = lanes_pairwise(q0, q1, q2, q3);                                               \
        }                                                                                          \
        out->fmax = _mm512_reduce_max_ps(_mm512_max_ps(max0, max1));                               \
        out->fmin = _mm512_reduce_min_ps(_mm512_min_ps(min0, min1));                               \
        out->zero = zero;                                                                          \
    }

AVX_F32_KERNEL(avx512_f4, float, load_f4)
AVX_F32_KERNEL(avx512_bf2, uint16_t, load_bf2)
AVX_F32_KERNEL(avx512_f2, uint16_t, load_f2)

#define AVX_F64_STEP(x, m, vmax, vmin, s, qq)                                                      \
    do {                                                                                           \
        vmax = _mm512_mask_max_pd(vmax, m, x, vmax);                                               \
        vmin = _mm512_mask_min_pd(vmin, m, x, vmin);                                               \
        s = _mm512_add_pd(s, x);                                                                   \
        qq = _mm512_add_pd(qq, _mm512_mul_pd(x, x)); /* not fused: as the portable kernel */      \
        cz = _mm512_mask_add_epi64(cz, _mm512_mask_cmp_pd_mask(m, x, zeros, _CMP_EQ_OQ), cz, ones); \
    } while (0)

static inline __mmask8 mask8(Py_ssize_t r) { return (__mmask8)(r >= 8 ? 0xFF : r <= 0 ? 0 : (1u << r) - 1); }

AVX512 static void avx512_f8(const double *p, Py_ssize_t n, double *bsum, double *bsq, Part *out) {
    const __m512d zeros = _mm512_setzero_pd();
    const __m512i ones = _mm512_set1_epi64(1);
    __m512d max0 = _mm512_set1_pd(-INFINITY), max1 = max0, min0 = _mm512_set1_pd(INFINITY), min1 = min0;
    int64_t zero = 0;
    for (Py_ssize_t b = 0; b * BLOCK < n; b++) {
        const double *q = p + b * BLOCK;
        Py_ssize_t m = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK, i = 0;
        __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
        __m512i cz = _mm512_setzero_si512();
        for (; i + LANES <= m; i += LANES) {
            __m512d x0 = _mm512_loadu_pd(q + i), x1 = _mm512_loadu_pd(q + i + 8);
            __m512d x2 = _mm512_loadu_pd(q + i + 16), x3 = _mm512_loadu_pd(q + i + 24);
            AVX_F64_STEP(x0, 0xFF, max0, min0, s0, q0);
            AVX_F64_STEP(x1, 0xFF, max1, min1, s1, q1);
            AVX_F64_STEP(x2, 0xFF, max0, min0, s2, q2);
            AVX_F64_STEP(x3, 0xFF, max1, min1, s3, q3);
        }
        if (i < m) {
            Py_ssize_t r = m - i;
            __mmask8 m0 = mask8(r), m1 = mask8(r - 8), m2 = mask8(r - 16), m3 = mask8(r - 24);
            __m512d x0 = _mm512_maskz_loadu_pd(m0, q + i), x1 = _mm512_maskz_loadu_pd(m1, q + i + 8);
            __m512d x2 = _mm512_maskz_loadu_pd(m2, q + i + 16), x3 = _mm512_maskz_loadu_pd(m3, q + i + 24);
            AVX_F64_STEP(x0, m0, max0, min0, s0, q0);
            AVX_F64_STEP(x1, m1, max1, min1, s1, q1);
            AVX_F64_STEP(x2, m2, max0, min0, s2, q2);
            AVX_F64_STEP(x3, m3, max1, min1, s3, q3);
        }
        zero += _mm512_reduce_add_epi64(cz);
        bsum[b] = lanes_pairwise(s0, s1, s2, s3);
        bsq[b] = lanes_pairwise(q0, q1, q2, q3);
    }
    out->fmax = _mm512_reduce_max_pd(_mm512_max_pd(max0, max1));
    out->fmin = _mm512_reduce_min_pd(_mm512_min_pd(min0, min1));
    out->zero = zero;
}

/* 8-bit integers, 64 per vector: exact sums with SAD (sum of |x - 0| per 8 bytes; int8 shifted by
 * 128), exact squares with 16-bit multiply-adds into 32-bit lanes (a block cannot overflow them).
 * Integer arithmetic is exact, so the results equal the portable kernel's. */
#define AVX_BYTE_KERNEL(NAME, CT, SIGNED, MAXOP, MINOP, WIDEN, PART_MAX, PART_MIN)                   \
    AVX512 static void NAME(const CT *p, Py_ssize_t n, double *bsum, double *bsq, Part *out) {     \
        const __m512i zeros = _mm512_setzero_si512(), bias = _mm512_set1_epi8((char)0x80);         \
        __m512i vmax = _mm512_set1_epi8((char)p[0]), vmin = vmax;                                  \
        __int128 total = 0;                                                                        \
        int64_t zero = 0;                                                                          \
        for (Py_ssize_t b = 0; b * BLOCK < n; b++) {                                               \
            const CT *q = p + b * BLOCK;                                                           \
            Py_ssize_t m = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;                          \
            __m512i sums = zeros, squares = zeros;                                                 \
            for (Py_ssize_t i = 0; i < m; i += 64) {                                               \
                __mmask64 k = m - i >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (m - i)) - 1);       \
                __m512i x = _mm512_maskz_loadu_epi8(k, q + i);                                     \
                vmax = MAXOP(vmax, k, x, vmax);                                                    \
                vmin = MINOP(vmin, k, x, vmin);                                                    \
                __m512i u = SIGNED ? _mm512_maskz_xor_epi32(0xFFFF, x, bias) : x;                  \
                if (SIGNED) u = _mm512_maskz_mov_epi8(k, u);  /* lanes past the end stay 0 */      \
                sums = _mm512_add_epi64(sums, _mm512_sad_epu8(u, zeros));                          \
                __m512i lo = WIDEN(_mm512_castsi512_si256(x)), hi = WIDEN(_mm512_extracti64x4_epi64(x, 1)); \
                squares = _mm512_add_epi32(squares, _mm512_madd_epi16(lo, lo));                    \
                squares = _mm512_add_epi32(squares, _mm512_madd_epi16(hi, hi));                    \
                zero += __builtin_popcountll(_mm512_mask_cmpeq_epi8_mask(k, x, zeros));            \
            }                                                                                      \
            total += (__int128)_mm512_reduce_add_epi64(sums) - (SIGNED ? 128 * (__int128)m : 0);   \
            bsum[b] = 0.0;                                                                         \
            bsq[b] = (double)_mm512_reduce_add_epi32(squares);                                     \
        }                                                                                          \
        CT hi[64], lo[64];                                                                         \
        _mm512_storeu_si512(hi, vmax);                                                             \
        _mm512_storeu_si512(lo, vmin);                                                             \
        CT top = hi[0], bottom = lo[0];                                                            \
        for (int j = 1; j < 64; j++) { top = hi[j] > top ? hi[j] : top; bottom = lo[j] < bottom ? lo[j] : bottom; } \
        out->PART_MAX = top; out->PART_MIN = bottom;                                               \
        out->isum = total; out->zero = zero;                                                       \
        out->nan = out->posinf = out->neginf = 0;                                                  \
    }

AVX_BYTE_KERNEL(avx512_u1, uint8_t, 0, _mm512_mask_max_epu8, _mm512_mask_min_epu8, _mm512_cvtepu8_epi16, umax, umin)
AVX_BYTE_KERNEL(avx512_i1, int8_t, 1, _mm512_mask_max_epi8, _mm512_mask_min_epi8, _mm512_cvtepi8_epi16, imax, imin)
#endif

/* ---- integer kernels. Exact sums in integer lanes that a block cannot overflow: AT lanes for
 * types up to 32 bits; 64-bit types as high and low 32-bit halves (WIDE), each in 64-bit lanes.
 * Squares: exact in integer SQT lanes for 8- and 16-bit types (x*x < 2**32, 128 terms per lane;
 * a block partial < 2**44 is exact in float64), else float64 lanes as for floats. */
#define INT_STEP(x, j)                                                                             \
    do {                                                                                           \
        mx[j] = (x) > mx[j] ? (x) : mx[j];                                                         \
        mn[j] = (x) < mn[j] ? (x) : mn[j];                                                         \
        if (WIDE) { hs[j] += (AT)((x) >> 16 >> 16); ls[j] += (uint64_t)(x) & 0xFFFFFFFFu; }        \
        else hs[j] += (AT)(x);                                                                     \
        sq[j] += (SQT)(x) * (SQT)(x);                                                              \
        cz[j] += (x) == 0;                                                                         \
    } while (0)

#define SQ_FLOAT(v) pairwise(v, LANES)
#define SQ_EXACT(v) ({ int64_t t_ = 0; for (int j_ = 0; j_ < LANES; j_++) t_ += (int64_t)(v)[j_]; (double)t_; })

#define INT_KERNEL(NAME, CT, AT_, SQT_, SQ_REDUCE, MAXF, MINF, WIDE_)                               \
    MULTIVERSION static void NAME(const CT *p, Py_ssize_t n, double *bsum, double *bsq, Part *out) { \
        typedef AT_ AT;                                                                            \
        typedef SQT_ SQT;                                                                          \
        enum { WIDE = WIDE_ };                                                                     \
        CT mx[LANES], mn[LANES];                                                                   \
        int64_t zero = 0;                                                                          \
        __int128 total = 0;                                                                        \
        for (int j = 0; j < LANES; j++) { mx[j] = p[0]; mn[j] = p[0]; }                            \
        for (Py_ssize_t b = 0; b * BLOCK < n; b++) {                                               \
            const CT *q = p + b * BLOCK;                                                           \
            Py_ssize_t m = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK, i = 0;                   \
            SQT sq[LANES] = {0};                                                                   \
            AT hs[LANES] = {0};                                                                    \
            uint64_t ls[LANES] = {0};                                                              \
            int32_t cz[LANES] = {0};                                                               \
            for (; i + LANES <= m; i += LANES)                                                     \
                for (int j = 0; j < LANES; j++) { CT x = q[i + j]; INT_STEP(x, j); }               \
            for (int j = 0; i < m; i++, j++) { CT x = q[i]; INT_STEP(x, j); }                      \
            for (int j = 0; j < LANES; j++) {                                                      \
                zero += cz[j];                                                                     \
                total += WIDE ? (((__int128)hs[j]) << 32) + (__int128)ls[j] : (__int128)hs[j];     \
            }                                                                                      \
            bsum[b] = 0.0;                                                                         \
            bsq[b] = SQ_REDUCE(sq);                                                                \
        }                                                                                          \
        CT hi = mx[0], lo = mn[0];                                                                 \
        for (int j = 1; j < LANES; j++) { hi = mx[j] > hi ? mx[j] : hi; lo = mn[j] < lo ? mn[j] : lo; } \
        out->MAXF = hi; out->MINF = lo;                                                            \
        out->isum = total; out->zero = zero;                                                       \
        out->nan = out->posinf = out->neginf = 0;                                                  \
    }

INT_KERNEL(generic_i1, int8_t, int32_t, int32_t, SQ_EXACT, imax, imin, 0)
INT_KERNEL(generic_i2, int16_t, int32_t, int64_t, SQ_EXACT, imax, imin, 0)
INT_KERNEL(generic_i4, int32_t, int64_t, double, SQ_FLOAT, imax, imin, 0)
INT_KERNEL(generic_i8, int64_t, int64_t, double, SQ_FLOAT, imax, imin, 1)
INT_KERNEL(generic_u1, uint8_t, uint32_t, uint32_t, SQ_EXACT, umax, umin, 0)
INT_KERNEL(generic_u2, uint16_t, uint32_t, uint64_t, SQ_EXACT, umax, umin, 0)
INT_KERNEL(generic_u4, uint32_t, uint64_t, double, SQ_FLOAT, umax, umin, 0)
INT_KERNEL(generic_u8, uint64_t, uint64_t, double, SQ_FLOAT, umax, umin, 1)

/* bool (one byte, 0 or 1): only the zeros are counted; max = any, min = all, sum = sum of squares
 * = the number of true elements. */
MULTIVERSION static void generic_b1(const uint8_t *p, Py_ssize_t n, double *bsum, double *bsq, Part *out) {
    int64_t zero = 0;
    for (Py_ssize_t b = 0; b * BLOCK < n; b++) {
        const uint8_t *q = p + b * BLOCK;
        Py_ssize_t m = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
        uint32_t cz = 0;
        for (Py_ssize_t i = 0; i < m; i++) cz += q[i] == 0;
        zero += cz;
        bsum[b] = 0.0;
        bsq[b] = (double)(m - (Py_ssize_t)cz);
    }
    out->umax = zero < n;
    out->umin = zero == 0;
    out->isum = n - zero;
    out->zero = zero;
    out->nan = out->posinf = out->neginf = 0;
}

typedef void (*Kernel)(const void *p, Py_ssize_t n, double *bsum, double *bsq, Part *out);

static const struct { const char *name; int itemsize; Kernel portable; } KINDS[] = {
    [K_F2] = {"f2", 2, (Kernel)generic_f2},   [K_BF2] = {"bf2", 2, (Kernel)generic_bf2},
    [K_F4] = {"f4", 4, (Kernel)generic_f4},   [K_F8] = {"f8", 8, (Kernel)generic_f8},
    [K_I1] = {"i1", 1, (Kernel)generic_i1},   [K_I2] = {"i2", 2, (Kernel)generic_i2},
    [K_I4] = {"i4", 4, (Kernel)generic_i4},   [K_I8] = {"i8", 8, (Kernel)generic_i8},
    [K_U1] = {"u1", 1, (Kernel)generic_u1},   [K_U2] = {"u2", 2, (Kernel)generic_u2},
    [K_U4] = {"u4", 4, (Kernel)generic_u4},   [K_U8] = {"u8", 8, (Kernel)generic_u8},
    [K_B1] = {"b1", 1, (Kernel)generic_b1},
};
#define NKINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

/* the kernel used for each kind: the AVX-512 one where the CPU has it, set at module load */
static Kernel fast[NKINDS];

static int is_float(Kind k) { return k == K_F2 || k == K_BF2 || k == K_F4 || k == K_F8; }
static int is_signed(Kind k) { return k == K_I1 || k == K_I2 || k == K_I4 || k == K_I8; }

/* NaN / +Inf / -Inf counts of one block. Only blocks whose partial sums are not finite can hold
 * any (a NaN or an Inf makes every sum it enters NaN or Inf), so the main loops never count them. */
#define COUNT_NONFINITE(CT, LOAD)                                                                  \
    do {                                                                                           \
        const CT *q = (const CT *)data;                                                            \
        for (Py_ssize_t i = 0; i < m; i++) {                                                       \
            double x = (double)LOAD(q[i]);                                                         \
            nan += x != x; pinf += x == INFINITY; ninf += x == -INFINITY;                          \
        }                                                                                          \
    } while (0)

static void count_nonfinite(Kind kind, const char *data, Py_ssize_t m, Part *part) {
    int64_t nan = 0, pinf = 0, ninf = 0;
    switch (kind) {
    case K_F2: COUNT_NONFINITE(uint16_t, f16_to_float); break;
    case K_BF2: COUNT_NONFINITE(uint16_t, bf16_to_float); break;
    case K_F4: COUNT_NONFINITE(float, LOAD_SAME); break;
    case K_F8: COUNT_NONFINITE(double, LOAD_SAME); break;
    default: break;
    }
    part->nan += nan; part->posinf += pinf; part->neginf += ninf;
}

static void run_job(Job *job) {
    Py_ssize_t b0 = job->first / BLOCK, nb = (job->count + BLOCK - 1) / BLOCK;
    int size = KINDS[job->kind].itemsize;
    const char *start = job->start ? job->start : job->data + job->first * size;
    Kernel kernel = job->portable ? KINDS[job->kind].portable : fast[job->kind];
    kernel(start, job->count, job->bsum + b0, job->bsq + b0, &job->part);
    if (!is_float(job->kind)) return;
    for (Py_ssize_t b = 0; b < nb; b++) {
        if (isfinite(job->bsum[b0 + b]) && isfinite(job->bsq[b0 + b])) continue;
        Py_ssize_t m = job->count - b * BLOCK < BLOCK ? job->count - b * BLOCK : BLOCK;
        count_nonfinite(job->kind, start + b * BLOCK * size, m, &job->part);
    }
}

/* Neumaier's compensated sum of v[0..n) in index order; the plain sum if that is not finite
 * (an Inf or NaN makes the compensation term NaN). */
static double compensated_sum(const double *v, Py_ssize_t n) {
    double s = 0.0, c = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        double x = v[i], t = s + x;
        c += fabs(s) >= fabs(x) ? (s - t) + x : (x - t) + s;
        s = t;
    }
    double r = s + c;
    return isfinite(r) ? r : s;
}

static void merge(Kind kind, Part *into, const Part *p) {
    if (is_float(kind)) {
        if (p->fmax > into->fmax) into->fmax = p->fmax;
        if (p->fmin < into->fmin) into->fmin = p->fmin;
    } else if (is_signed(kind)) {
        if (p->imax > into->imax) into->imax = p->imax;
        if (p->imin < into->imin) into->imin = p->imin;
    } else {
        if (p->umax > into->umax) into->umax = p->umax;
        if (p->umin < into->umin) into->umin = p->umin;
    }
    into->isum += p->isum;
    into->nan += p->nan; into->posinf += p->posinf; into->neginf += p->neginf; into->zero += p->zero;
}

static PyObject *int128_to_py(__int128 v) {
    PyObject *high = PyLong_FromLongLong((long long)(v >> 64));
    PyObject *low = PyLong_FromUnsignedLongLong((unsigned long long)(uint64_t)v);
    PyObject *shift = PyLong_FromLong(64), *out = NULL, *shifted = NULL;
    if (high && low && shift && (shifted = PyNumber_Lshift(high, shift)))
        out = PyNumber_Add(shifted, low);
    Py_XDECREF(high); Py_XDECREF(low); Py_XDECREF(shift); Py_XDECREF(shifted);
    return out;
}

/* ---- driver. The buffer is cut into chunks of CHUNK_BLOCKS blocks; each chunk is one kernel call
 * with its own Part, and the Parts are merged in chunk order, so that even the sign of a zero
 * extreme does not depend on the threads. Threads take chunks from a shared counter (a thread that
 * the OS does not schedule in time takes none), and the caller waits for the chunks, not for the
 * threads: a thread that starts late finds no chunk left and frees the shared state if it is the
 * last owner. */
#define CHUNK_BLOCKS 64

typedef struct {
    const char *data;
    Py_ssize_t n, nchunks;
    Kind kind;
    int portable;
    double *bsum, *bsq;
    Part *parts;
    const Layout *layout;       /* NULL: data is contiguous; else &strided, chunks gathered */
    Layout strided;
    Py_ssize_t next;            /* next chunk to take (atomic) */
    Py_ssize_t done;            /* chunks finished (under lock) */
    int owners;                 /* the caller and the started threads (under lock) */
    pthread_mutex_t lock;
    pthread_cond_t all_done;
} Shared;

static void run_chunk(const char *data, Py_ssize_t n, Kind kind, int portable, double *bsum, double *bsq,
                      Py_ssize_t c, Part *part) {
    Job job;
    memset(&job, 0, sizeof job);
    job.data = data;
    job.first = c * CHUNK_BLOCKS * BLOCK;
    job.count = n - job.first < CHUNK_BLOCKS * BLOCK ? n - job.first : CHUNK_BLOCKS * BLOCK;
    job.kind = kind;
    job.portable = portable;
    job.bsum = bsum;
    job.bsq = bsq;
    run_job(&job);
    *part = job.part;
}

/* A transposed layout (the last dimension strided, the one before it contiguous): whole rows of the
 * last index from index[] on, copied TILE rows at a time so that each read takes TILE neighbouring
 * elements (one cache line of float32) instead of one element per line and per page; index[],
 * *count and *out advance past them. */
#define TILE 16
#define TILE_COPY(T)                                                                               \
    for (Py_ssize_t j = 0; j < inner; j++) {                                                       \
        const T *q = (const T *)(p + j * step);                                                    \
        T *o = (T *)*out + j;                                                                      \
        for (Py_ssize_t r = 0; r < g; r++) memcpy(o + r * inner, q + r, sizeof(T));               \
    }

static void gather_transposed(const char *base, const Layout *lay, int size, Py_ssize_t *index, Py_ssize_t *count,
                              char **out) {
    int last = lay->ndim - 1;
    Py_ssize_t inner = lay->dims[last], step = lay->steps[last];
    while (index[last] == 0 && *count >= inner) {
        Py_ssize_t g = lay->dims[last - 1] - index[last - 1];
        if (g > TILE) g = TILE;
        if (g * inner > *count) g = *count / inner;
        const char *p = base;
        for (int i = 0; i < last; i++) p += index[i] * lay->steps[i];
        if (size == 4) { TILE_COPY(uint32_t) }
        else if (size == 2) { TILE_COPY(uint16_t) }
        else if (size == 8) { TILE_COPY(uint64_t) }
        else { TILE_COPY(uint8_t) }
        *out += g * inner * size;
        *count -= g * inner;
        index[last - 1] += g;
        for (int i = last - 1; i > 0 && index[i] == lay->dims[i]; i--) {
            index[i] = 0;
            index[i - 1]++;
        }
    }
}

/* Elements [first, first + count) of the C-order sequence of a strided array at `base` copied into
 * `out` (item size `size`). */
static void gather_range(const char *base, const Layout *lay, int size, Py_ssize_t first, Py_ssize_t count,
                         char *out) {
    int last = lay->ndim - 1;
    Py_ssize_t index[MAX_DIMS], rest = first;
    for (int i = last; i >= 0; i--) {
        index[i] = rest % lay->dims[i];
        rest /= lay->dims[i];
    }
    Py_ssize_t step = lay->steps[last];
    if (last >= 1 && lay->steps[last - 1] == size && step != size)
        gather_transposed(base, lay, size, index, &count, &out);
    while (count > 0) {
        const char *p = base;
        for (int i = 0; i <= last; i++) p += index[i] * lay->steps[i];
        Py_ssize_t r = lay->dims[last] - index[last];
        if (r > count) r = count;
        /* a constant size per loop: each memcpy becomes one load and one store */
        if (step == size) memcpy(out, p, (size_t)(r * size));
        else if (size == 4) for (Py_ssize_t j = 0; j < r; j++, p += step) memcpy(out + 4 * j, p, 4);
        else if (size == 2) for (Py_ssize_t j = 0; j < r; j++, p += step) memcpy(out + 2 * j, p, 2);
        else if (size == 8) for (Py_ssize_t j = 0; j < r; j++, p += step) memcpy(out + 8 * j, p, 8);
        else for (Py_ssize_t j = 0; j < r; j++, p += step) out[j] = *p;
        out += r * size;
        count -= r;
        index[last] += r;
        for (int i = last; i > 0 && index[i] == lay->dims[i]; i--) {
            index[i] = 0;
            index[i - 1]++;
        }
    }
}

/* The gather buffer of the calling thread (one chunk), kept from call to call: chunks of strided
 * arrays are copied into memory that is already mapped and in cache. NULL if out of memory. */
static __thread char *gather_buf;
static __thread size_t gather_cap;

static char *gather_buffer(int size) {
    size_t need = (size_t)CHUNK_BLOCKS * BLOCK * (size_t)size;
    if (gather_cap < need) {
        char *bigger = malloc(need);
        if (bigger == NULL) return NULL;
        free(gather_buf);
        gather_buf = bigger;
        gather_cap = need;
    }
    return gather_buf;
}

static void free_gather_buffer(void) {
    free(gather_buf);
    gather_buf = NULL;
    gather_cap = 0;
}

/* Chunk c of [0, n): in place for contiguous data, else gathered into `buf` first. */
static void run_any_chunk(const char *data, const Layout *lay, char *buf, Py_ssize_t n, Kind kind, int portable,
                          double *bsum, double *bsq, Py_ssize_t c, Part *part) {
    if (lay == NULL) {
        run_chunk(data, n, kind, portable, bsum, bsq, c, part);
        return;
    }
    Job job;
    memset(&job, 0, sizeof job);
    job.first = c * CHUNK_BLOCKS * BLOCK;
    job.count = n - job.first < CHUNK_BLOCKS * BLOCK ? n - job.first : CHUNK_BLOCKS * BLOCK;
    gather_range(data, lay, KINDS[kind].itemsize, job.first, job.count, buf);
    job.data = data;
    job.start = buf;
    job.kind = kind;
    job.portable = portable;
    job.bsum = bsum;
    job.bsq = bsq;
    run_job(&job);
    *part = job.part;
}

static void take_chunks(Shared *sh) {
    char *buf = NULL;
    if (sh->layout != NULL && (buf = gather_buffer(KINDS[sh->kind].itemsize)) == NULL)
        return;  /* no buffer for this thread: the others take the chunks (the caller has one) */
    for (;;) {
        Py_ssize_t c = __atomic_fetch_add(&sh->next, 1, __ATOMIC_RELAXED);
        if (c >= sh->nchunks) return;
        run_any_chunk(sh->data, sh->layout, buf, sh->n, sh->kind, sh->portable, sh->bsum, sh->bsq, c,
                      &sh->parts[c]);
        pthread_mutex_lock(&sh->lock);
        if (++sh->done == sh->nchunks) pthread_cond_signal(&sh->all_done);
        pthread_mutex_unlock(&sh->lock);
    }
}

static void release(Shared *sh) {
    pthread_mutex_lock(&sh->lock);
    int last = --sh->owners == 0;
    pthread_mutex_unlock(&sh->lock);
    if (last) {
        pthread_mutex_destroy(&sh->lock);
        pthread_cond_destroy(&sh->all_done);
        free(sh);
    }
}

static void *worker(void *arg) {
    take_chunks((Shared *)arg);
    release((Shared *)arg);
    free_gather_buffer();  /* the thread ends: its buffer with it */
    return NULL;
}

/* Reduces [0, n) with up to `threads` threads into *total, *sum and *sumsq; -1 if out of memory.
 * `lay`: NULL for contiguous data, else the strided layout of the elements at `data`. */
static int run(const char *data, const Layout *lay, Py_ssize_t n, Kind kind, int threads, int portable,
               Part *total, double *sum, double *sumsq) {
    char *buf = NULL;
    if (lay != NULL && (buf = gather_buffer(KINDS[kind].itemsize)) == NULL) return -1;
    Py_ssize_t nblocks = (n + BLOCK - 1) / BLOCK, nchunks = (nblocks + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS;
    Py_ssize_t want = n / MIN_PER_THREAD;
    if (want > threads) want = threads;
    if (want > MAX_THREADS) want = MAX_THREADS;
    if (want > nchunks) want = nchunks;
    if (want <= 1) {  /* this thread alone: the same chunks, merged in the same order */
        double small[2 * 8];
        double *partials = nblocks <= 8 ? small : malloc(sizeof(double) * 2 * (size_t)nblocks);
        if (partials == NULL) return -1;
        for (Py_ssize_t c = 0; c < nchunks; c++) {
            Part part;
            run_any_chunk(data, lay, buf, n, kind, portable, partials, partials + nblocks, c, &part);
            if (c == 0) *total = part;
            else merge(kind, total, &part);
        }
        *sum = compensated_sum(partials, nblocks);
        *sumsq = compensated_sum(partials + nblocks, nblocks);
        if (partials != small) free(partials);
        return 0;
    }
    size_t head = (sizeof(Shared) + 63) / 64 * 64;  /* Part holds an __int128: keep it aligned */
    Shared *sh = aligned_alloc(64, head + (sizeof(Part) * (size_t)nchunks + sizeof(double) * 2 * (size_t)nblocks
                                           + 63) / 64 * 64);
    if (sh == NULL) return -1;
    memset(sh, 0, sizeof *sh);
    sh->parts = (Part *)((char *)sh + head);
    sh->bsum = (double *)(sh->parts + nchunks);
    sh->bsq = sh->bsum + nblocks;
    sh->data = data;
    if (lay != NULL) {
        sh->strided = *lay;
        sh->layout = &sh->strided;
    }
    sh->n = n;
    sh->nchunks = nchunks;
    sh->kind = kind;
    sh->portable = portable;
    sh->owners = 1;
    pthread_mutex_init(&sh->lock, NULL);
    pthread_cond_init(&sh->all_done, NULL);
    pthread_attr_t attr;
    int detached = pthread_attr_init(&attr) == 0 &&
                   pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0;
    for (Py_ssize_t t = 1; detached && t < want; t++) {
        pthread_t tid;
        pthread_mutex_lock(&sh->lock);
        sh->owners++;
        pthread_mutex_unlock(&sh->lock);
        if (pthread_create(&tid, &attr, worker, sh) != 0) {  /* no thread: this one does the work */
            pthread_mutex_lock(&sh->lock);
            sh->owners--;
            pthread_mutex_unlock(&sh->lock);
            break;
        }
    }
    if (detached) pthread_attr_destroy(&attr);
    take_chunks(sh);
    pthread_mutex_lock(&sh->lock);
    while (sh->done < sh->nchunks) pthread_cond_wait(&sh->all_done, &sh->lock);
    pthread_mutex_unlock(&sh->lock);
    *total = sh->parts[0];
    for (Py_ssize_t c = 1; c < nchunks; c++) merge(kind, total, &sh->parts[c]);
    *sum = compensated_sum(sh->bsum, nblocks);
    *sumsq = compensated_sum(sh->bsq, nblocks);
    release(sh);
    return 0;
}

static PyObject *result_tuple(Kind kind, const Part *part, double sum, double sumsq);

/* the Kind named `name`, or -1 with ValueError set */
static int kind_of(const char *name) {
    for (int i = 0; i < NKINDS; i++)
        if (strcmp(name, KINDS[i].name) == 0) return i;
    PyErr_Format(PyExc_ValueError, "unsupported kind '%s'", name);
    return -1;
}

static PyObject *scan(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"buffer", "kind", "threads", "portable", NULL};
    PyObject *obj;
    const char *kind_name;
    int threads = 1, portable = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Os|ip:scan", keywords, &obj, &kind_name, &threads,
                                     &portable))
        return NULL;
    int k = kind_of(kind_name);
    if (k < 0) return NULL;
    Kind kind = (Kind)k;
    int itemsize = KINDS[k].itemsize;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (view.len % itemsize != 0 || view.len == 0 || (uintptr_t)view.buf % (uintptr_t)itemsize != 0) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError,
                            "buffer of %zd bytes is not a non-empty, aligned array of %d-byte items",
                            view.len, itemsize);
    }
    Py_ssize_t n = view.len / itemsize;
    double sum, sumsq;
    Part total;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = run((const char *)view.buf, NULL, n, kind, threads < 1 ? 1 : threads, portable, &total, &sum, &sumsq);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status < 0) return PyErr_NoMemory();
    return result_tuple(kind, &total, sum, sumsq);
}

/* (max, min, sum, sum_sq, nan, posinf, neginf, zero) of a reduction (the docstring's types) */
static PyObject *result_tuple(Kind kind, const Part *part, double sum, double sumsq) {
    Part total = *part;
    PyObject *mx, *mn, *sm;
    if (is_float(kind)) {
        mx = PyFloat_FromDouble(total.fmax);
        mn = PyFloat_FromDouble(total.fmin);
        sm = PyFloat_FromDouble(sum);
    } else if (is_signed(kind)) {
        mx = PyLong_FromLongLong(total.imax);
        mn = PyLong_FromLongLong(total.imin);
        sm = int128_to_py(total.isum);
    } else {
        mx = PyLong_FromUnsignedLongLong(total.umax);
        mn = PyLong_FromUnsignedLongLong(total.umin);
        sm = int128_to_py(total.isum);
    }
    if (!mx || !mn || !sm) {
        Py_XDECREF(mx); Py_XDECREF(mn); Py_XDECREF(sm);
        return NULL;
    }
    return Py_BuildValue("(NNNdLLLL)", mx, mn, sm, sumsq, (long long)total.nan, (long long)total.posinf,
                         (long long)total.neginf, (long long)total.zero);
}


/* shape and strides (Python sequences of ints) as a Layout without dimensions of one element, with
 * neighbouring dimensions that are one merged; *n = the element count, *extent = the bytes from the
 * first element to the end of the last. 0, or -1 with ValueError/TypeError set. */
static int parse_layout(PyObject *shape, PyObject *strides, int size, Layout *lay, Py_ssize_t *n,
                        Py_ssize_t *extent) {
    PyObject *dims = PySequence_Fast(shape, "shape must be a sequence of ints");
    if (dims == NULL) return -1;
    PyObject *steps = PySequence_Fast(strides, "strides must be a sequence of ints");
    if (steps == NULL) { Py_DECREF(dims); return -1; }
    Py_ssize_t ndim = PySequence_Fast_GET_SIZE(dims);
    int status = -1;
    if (ndim != PySequence_Fast_GET_SIZE(steps) || ndim > MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "shape and strides must have the same length, at most %d", MAX_DIMS);
        goto done;
    }
    *n = 1;
    *extent = size;
    lay->ndim = 0;
    for (Py_ssize_t i = 0; i < ndim; i++) {
        Py_ssize_t d = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(dims, i));
        Py_ssize_t st = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(steps, i));
        if (PyErr_Occurred()) goto done;
        if (d < 0 || st < 0 || st % size != 0) {
            PyErr_Format(PyExc_ValueError, "dimension %zd: %zd elements %zd bytes apart (need >= 0, a multiple "
                         "of the item size %d)", i, d, st, size);
            goto done;
        }
        if (d > 0 && *n > PY_SSIZE_T_MAX / d) { PyErr_SetString(PyExc_ValueError, "too many elements"); goto done; }
        *n *= d;
        if (d > 0) *extent += (d - 1) * st;
        if (d == 1) continue;
        int j = lay->ndim - 1;
        if (j >= 0 && lay->steps[j] == st * d) {  /* one dimension with the one before it */
            lay->dims[j] *= d;
            lay->steps[j] = st;
            continue;
        }
        lay->dims[lay->ndim] = d;
        lay->steps[lay->ndim++] = st;
    }
    if (lay->ndim == 0) {  /* one element */
        lay->ndim = 1;
        lay->dims[0] = 1;
        lay->steps[0] = size;
    }
    status = 0;
done:
    Py_DECREF(dims);
    Py_DECREF(steps);
    return status;
}

static PyObject *scan_strided(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"buffer", "kind", "shape", "strides", "threads", "portable", NULL};
    PyObject *obj, *shape, *strides;
    const char *kind_name;
    int threads = 1, portable = 0;
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OsOO|ip:scan_strided", keywords, &obj, &kind_name, &shape,
                                     &strides, &threads, &portable))
        return NULL;
    int k = kind_of(kind_name);
    if (k < 0) return NULL;
    Kind kind = (Kind)k;
    int size = KINDS[k].itemsize;
    Layout lay;
    Py_ssize_t n, extent;
    if (parse_layout(shape, strides, size, &lay, &n, &extent) < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return NULL;
    if (n == 0) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "scan_strided() needs at least one element");
    }
    if (extent > view.len || (uintptr_t)view.buf % (uintptr_t)size != 0) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError,
                            "%zd elements spanning %zd bytes do not fit a buffer of %zd bytes aligned to %d",
                            n, extent, view.len, size);
    }
    int contiguous = lay.ndim == 1 && lay.steps[0] == size;
    double sum, sumsq;
    Part total;
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = run((const char *)view.buf, contiguous ? NULL : &lay, n, kind, threads < 1 ? 1 : threads, portable,
                 &total, &sum, &sumsq);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (status < 0) return PyErr_NoMemory();
    return result_tuple(kind, &total, sum, sumsq);
}

static PyMethodDef methods[] = {
    {"scan", (PyCFunction)(void (*)(void))scan, METH_VARARGS | METH_KEYWORDS,
     "scan(buffer, kind, threads=1, portable=False) -> (max, min, sum, sum_sq, nan, posinf, neginf, zero)\n\n"
     "Fused statistics of a non-empty C-contiguous buffer read as `kind` ('f2', 'bf2', 'f4', 'f8',\n"
     "'i1', 'i2', 'i4', 'i8', 'u1', 'u2', 'u4', 'u8', 'b1'), with up to `threads` threads and the GIL\n"
     "released. portable=True uses the portable C loops even on an AVX-512 CPU (same bits).\n"
     "Raises ValueError for an unknown kind or an empty, misaligned or ragged buffer,\n"
     "BufferError for a non-contiguous buffer."},
    {"scan_strided", (PyCFunction)(void (*)(void))scan_strided, METH_VARARGS | METH_KEYWORDS,
     "scan_strided(buffer, kind, shape, strides, threads=1, portable=False) -> scan()'s tuple\n\n"
     "scan() of the C-contiguous copy of a strided array, bit for bit, without making that copy:\n"
     "`buffer` holds the bytes from the element at index 0 to the last element, `shape` the element\n"
     "counts, `strides` the bytes between neighbours in each dimension (>= 0, multiples of the item\n"
     "size). Raises ValueError for an unknown kind, bad strides, no elements, or elements outside the\n"
     "buffer or misaligned; MemoryError when the chunk buffer cannot be allocated."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_stats_kernel",
    "Compiled fused statistics kernel of msprobe.tensors.stats (see scan).", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__stats_kernel(void) {
    for (int i = 0; i < NKINDS; i++) fast[i] = KINDS[i].portable;
#if HAVE_AVX512
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl")) {
        fast[K_F4] = (Kernel)avx512_f4;
        fast[K_BF2] = (Kernel)avx512_bf2;
        fast[K_F2] = (Kernel)avx512_f2;
        fast[K_F8] = (Kernel)avx512_f8;
        fast[K_U1] = (Kernel)avx512_u1;
        fast[K_I1] = (Kernel)avx512_i1;
    }
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0 || PyModule_AddIntConstant(m, "LANES", LANES) < 0 ||
        PyModule_AddIntConstant(m, "MIN_PER_THREAD", MIN_PER_THREAD) < 0 ||
        PyModule_AddIntConstant(m, "AVX512", fast[K_F4] != KINDS[K_F4].portable) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
