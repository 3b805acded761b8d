/* Sums over a row in eight float lanes, the lanes (and the tail) then added up in
   double. One double accumulator makes every add wait for the one before (no
   vectorizing: a compiler may not reorder float adds), which made a layer norm of
   128-wide rows 4x slower than PyTorch's. The lanes are one GCC vector (8 floats:
   one AVX register, two SSE ones), written as such because GCC turned the same
   sums over a float[8] into shuffles of scalar adds. */
#ifndef TNT_LANES_H
#define TNT_LANES_H

#include <math.h>
#include <stdint.h>

typedef float tnt_lanes __attribute__((vector_size(32)));
typedef float tnt_lanes_u __attribute__((vector_size(32), aligned(4), may_alias));

/* the eight floats at p (unaligned); a macro, as vector arguments and results of
   functions depend on the ABI of the target the function is built for */
#define LANES_AT(p) ((tnt_lanes)*(const tnt_lanes_u *)(p))

static inline __attribute__((always_inline)) double lanes_total(const tnt_lanes *acc)
{
    double s = 0;
    for (int k = 0; k < 8; k++)
        s += (*acc)[k];
    return s;
}

/* sum of a[j] */
static inline __attribute__((always_inline)) double sum8(const float *a, int64_t n)
{
    tnt_lanes acc = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        acc += LANES_AT(a + j);
    double s = lanes_total(&acc);
    for (; j < n; j++)
        s += a[j];
    return s;
}

/* sum of a[j] b[j] */
static inline __attribute__((always_inline)) double dot8(const float *a, const float *b, int64_t n)
{
    tnt_lanes acc = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        acc += LANES_AT(a + j) * LANES_AT(b + j);
    double s = lanes_total(&acc);
    for (; j < n; j++)
        s += (double)a[j] * b[j];
    return s;
}

/* sum of (a[j] - c)^2: a variance about a known mean, or (c = 0) a sum of squares */
static inline __attribute__((always_inline)) double sqdev8(const float *a, float c, int64_t n)
{
    tnt_lanes acc = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        tnt_lanes d = LANES_AT(a + j) - c;
        acc += d * d;
    }
    double s = lanes_total(&acc);
    for (; j < n; j++) {
        float d = a[j] - c;
        s += d * d;
    }
    return s;
}

/* a norm's input-gradient sums: sum of g[j] w[j] (g[j] without w) and of that times
   (x[j] - mu) rs, the normalized input (mu 0 for RMS norm) */
static inline __attribute__((always_inline)) void gw_sums8(const float *g, const float *w, const float *x, float mu,
                                                           float rs, int64_t n, double *sum_gw, double *sum_gw_xhat)
{
    tnt_lanes la = { 0 }, lc = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        tnt_lanes gw = w ? LANES_AT(g + j) * LANES_AT(w + j) : LANES_AT(g + j);
        la += gw;
        lc += gw * ((LANES_AT(x + j) - mu) * rs);
    }
    double a = lanes_total(&la), c = lanes_total(&lc);
    for (; j < n; j++) {
        float gw = w ? g[j] * w[j] : g[j];
        a += gw;
        c += gw * ((x[j] - mu) * rs);
    }
    *sum_gw = a;
    *sum_gw_xhat = c;
}

/* the largest a[j], NaNs left out (-inf for none) */
static inline __attribute__((always_inline)) float max8(const float *a, int64_t n)
{
    typedef int32_t mask __attribute__((vector_size(32)));
    tnt_lanes acc = { -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        tnt_lanes v = LANES_AT(a + j);
        mask gt = v > acc;  /* false for a NaN: it is never taken */
        acc = (tnt_lanes)(((mask)v & gt) | ((mask)acc & ~gt));
    }
    float m = -INFINITY;
    for (int k = 0; k < 8; k++)
        m = acc[k] > m ? acc[k] : m;
    for (; j < n; j++)
        m = a[j] > m ? a[j] : m;
    return m;
}

#endif
