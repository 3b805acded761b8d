/* The row-wise kernels of rows.h. Sums are accumulated in double (row sums in float
   lanes first: lanes.h). */
#include "rows.h"
#include "fmath.h"
#include "lanes.h"
#include "nn.h"
#include "typed.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

tnt_aten_run_t tnt_aten_run = NULL;

void tnt_set_aten(uintptr_t run)
{
    tnt_aten_run = (tnt_aten_run_t)run;
}

static int nbuf_of(int kind, const int32_t *p)
{
    switch (kind) {
    case TNT_ROWS_SOFTMAX: return 2;
    case TNT_ROWS_SOFTMAX_BACKWARD: return 3;
    case TNT_ROWS_LAYER_NORM: return 4 + (p[2] != 0) + (p[3] != 0);
    case TNT_ROWS_LAYER_NORM_GRAD: return 5 + (p[3] != 0) + (p[4] != 0);
    case TNT_ROWS_SUM: return 2;
    case TNT_ROWS_GATHER: return 3;
    case TNT_ROWS_EMBEDDING_GRAD: return 3;
    case TNT_ROWS_NLL: return 3;
    case TNT_ROWS_NLL_WEIGHT: return 2;
    case TNT_ROWS_NLL_GRAD: return 4;
    case TNT_ROWS_ARANGE: return 1;
    case TNT_ROWS_SGD: return 3 + (p[1] != 0) + (p[2] != 0);
    case TNT_ROWS_ADAMW: return 7 + 2 * (p[1] != 0) + (p[4] != 0);
    case TNT_ROWS_RMS_NORM: return 3 + (p[2] != 0);
    case TNT_ROWS_RMS_NORM_GRAD: return 4 + (p[3] != 0);
    case TNT_ROWS_ROPE: return 4;
    default: return -1;
    }
}

int tnt_rows_check(int kind, const int32_t *p, int nints, int nconst, int nbuf)
{
    /* parameters per kind, how many of the first ones are sizes (never negative), constants */
    static const int want[TNT_ROWS_NKINDS] = { 0, 4, 4, 4, 6, -1, 4, 4, 6, 6, 2, 6, 3, 6, 5, 3, 5, 6 };
    static const int sizes[TNT_ROWS_NKINDS] = { 0, 3, 3, 2, 2, 0, 3, 3, 3, 4, 1, 3, 3, 1, 1, 2, 2, 4 };
    static const int nconsts[TNT_ROWS_NKINDS] = { 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 4, 7, 1, 0, 0 };
    if (kind == TNT_ROWS_INGRESS)  /* a box copy whose source (buffer 1 of the copy) is the data */
        return nconst == 1 ? tnt_typed_check(TNT_ROWS_COPY_BOXES, p, nints, nbuf + 1) : -1;
    if (kind == TNT_ROWS_COPY_BOXES || (kind >= TNT_ROWS_MAP && kind <= TNT_ROWS_ISUM))
        return nconst == 0 ? tnt_typed_check(kind, p, nints, nbuf) : -1;
    if (kind == TNT_ROWS_ATEN)
        return tnt_aten_run != NULL && nints == 1 && p[0] == nbuf && nconst == 1 ? 0 : -1;
    if (kind > TNT_ROWS_ISUM && kind < TNT_ROWS_NKINDS)
        return nconst == (kind == TNT_ROWS_BN_COMBINE ? 2 : 0) ? tnt_nn_check(kind, p, nints, nbuf) : -1;
    if (kind < TNT_ROWS_SOFTMAX || kind >= TNT_ROWS_NKINDS || nints != want[kind] || nconst != nconsts[kind])
        return -1;
    for (int i = 0; i < sizes[kind]; i++)
        if (p[i] < 0)
            return -1;
    if ((kind == TNT_ROWS_LAYER_NORM_GRAD && (p[2] < 0 || p[2] > 2))
        || (kind == TNT_ROWS_RMS_NORM_GRAD && (p[2] < 0 || p[2] > 1)) || (kind == TNT_ROWS_ROPE && p[2] % 2))
        return -1;
    return nbuf_of(kind, p) == nbuf ? 0 : -1;
}

/* softmax / log_softmax of one contiguous row; o may serve as scratch. A NaN in the
   row is left out of the max but makes the sum, hence every output, NaN. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void softmax_row(int as_log, int64_t n, float *restrict o, const float *restrict x)
{
    float m = max8(x, n);
    for (int64_t j = 0; j < n; j++)
        o[j] = fexp(x[j] - m);
    double s = sum8(o, n);
    if (as_log) {
        float shift = m + (float)log(s);
        for (int64_t j = 0; j < n; j++)
            o[j] = x[j] - shift;
    } else {
        float inv = (float)(1.0 / s);
        for (int64_t j = 0; j < n; j++)
            o[j] *= inv;
    }
}

/* softmax / log_softmax along the middle extent */
static void softmax(const int32_t *p, void *const *bufs)
{
    int64_t outer = p[0], n = p[1], inner = p[2];
    int as_log = p[3];
    float *o = bufs[0];
    const float *x = bufs[1];
    if (inner == 1) {
        for (int64_t a = 0; a < outer; a++)
            softmax_row(as_log, n, o + a * n, x + a * n);
        return;
    }
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            const float *xr = x + a * n * inner + c;
            float *orow = o + a * n * inner + c;
            float m = -INFINITY;
            for (int64_t j = 0; j < n; j++)
                m = xr[j * inner] > m ? xr[j * inner] : m;
            double s = 0;
            for (int64_t j = 0; j < n; j++)
                s += fexp(xr[j * inner] - m);
            float shift = m + (float)log(s), inv = (float)(1.0 / s);
            for (int64_t j = 0; j < n; j++)
                orow[j * inner] = as_log ? xr[j * inner] - shift : fexp(xr[j * inner] - m) * inv;
        }
}

/* softmax: g_in = y (g - sum(g y)); log_softmax: g_in = g - exp(y) sum(g) */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void softmax_backward(const int32_t *p, void *const *bufs)
{
    int64_t outer = p[0], n = p[1], inner = p[2];
    int as_log = p[3];
    float *o = bufs[0];
    const float *g = bufs[1], *y = bufs[2];
    if (inner == 1) {
        for (int64_t a = 0; a < outer; a++) {
            const float *gr = g + a * n, *yr = y + a * n;
            float *orow = o + a * n;
            float s = (float)(as_log ? sum8(gr, n) : dot8(gr, yr, n));
            if (as_log)
                for (int64_t j = 0; j < n; j++)
                    orow[j] = gr[j] - fexp(yr[j]) * s;
            else
                for (int64_t j = 0; j < n; j++)
                    orow[j] = yr[j] * (gr[j] - s);
        }
        return;
    }
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            int64_t base = a * n * inner + c;
            double s = 0;
            for (int64_t j = 0; j < n; j++)
                s += as_log ? (double)g[base + j * inner] : (double)g[base + j * inner] * y[base + j * inner];
            float sf = (float)s;
            for (int64_t j = 0; j < n; j++) {
                int64_t i = base + j * inner;
                o[i] = as_log ? g[i] - fexp(y[i]) * sf : y[i] * (g[i] - sf);
            }
        }
}

__attribute__((target_clones("avx512f", "avx2", "default")))
static void layer_norm(const int32_t *p, const double *consts, void *const *bufs)
{
    int64_t rows = p[0], n = p[1];
    int has_w = p[2], has_b = p[3];
    float *y = bufs[0], *mean = bufs[1], *rstd = bufs[2];
    const float *x = bufs[3], *w = has_w ? bufs[4] : NULL, *b = has_b ? bufs[4 + has_w] : NULL;
    float eps = (float)consts[0];
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float muf = (float)(sum8(xr, n) / (double)n);
        float var = (float)(sqdev8(xr, muf, n) / (double)n);
        float rs = 1.0f / sqrtf((var > 0 ? var : 0) + eps);
        mean[r] = muf;
        rstd[r] = rs;
        for (int64_t j = 0; j < n; j++) {
            float v = (xr[j] - muf) * rs;
            if (has_w)
                v *= w[j];
            if (has_b)
                v += b[j];
            yr[j] = v;
        }
    }
}

__attribute__((target_clones("avx512f", "avx2", "default")))
static void layer_norm_grad(const int32_t *p, void *const *bufs)
{
    int64_t rows = p[0], n = p[1];
    int which = p[2], has_w = p[3], accumulate = p[5];
    float *o = bufs[0];
    const float *g = bufs[1], *x = bufs[2], *mean = bufs[3], *rstd = bufs[4];
    const float *w = has_w ? bufs[5] : NULL;
    if (which == 0) {  /* g_x = rstd (g w - mean(g w) - xhat mean(g w xhat)) */
        for (int64_t r = 0; r < rows; r++) {
            const float *gr = g + r * n, *xr = x + r * n;
            float mu = mean[r], rs = rstd[r];
            double a, c;
            gw_sums8(gr, w, xr, mu, rs, n, &a, &c);
            float an = (float)(a / (double)n), cn = (float)(c / (double)n);
            float *orow = o + r * n;
            for (int64_t j = 0; j < n; j++) {
                float gw = has_w ? gr[j] * w[j] : gr[j];
                float v = rs * (gw - an - (xr[j] - mu) * rs * cn);
                orow[j] = accumulate ? orow[j] + v : v;
            }
        }
        return;
    }
    /* weight: sum over rows of g xhat; bias: sum over rows of g (columns in blocks) */
    enum { COLS = 512 };
    double acc[COLS];
    for (int64_t j0 = 0; j0 < n; j0 += COLS) {
        int64_t nc = n - j0 < COLS ? n - j0 : COLS;
        for (int64_t j = 0; j < nc; j++)
            acc[j] = 0;
        for (int64_t r = 0; r < rows; r++) {
            const float *gr = g + r * n + j0, *xr = x + r * n + j0;
            float mu = mean[r], rs = rstd[r];
            if (which == 1)
                for (int64_t j = 0; j < nc; j++)
                    acc[j] += (double)gr[j] * ((xr[j] - mu) * rs);
            else
                for (int64_t j = 0; j < nc; j++)
                    acc[j] += gr[j];
        }
        for (int64_t j = 0; j < nc; j++)
            o[j0 + j] = accumulate ? o[j0 + j] + (float)acc[j] : (float)acc[j];
    }
}

/* Sums over the middle extent, in double: rows of n (inner 1) or columns of blocks. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void sum_middle(const int32_t *p, void *const *bufs)
{
    int64_t outer = p[0], n = p[1], inner = p[2];
    int accumulate = p[3];
    float *o = bufs[0];
    const float *x = bufs[1];
    if (inner == 1) {
        for (int64_t a = 0; a < outer; a++) {
            float v = (float)sum8(x + a * n, n);
            o[a] = accumulate ? o[a] + v : v;
        }
        return;
    }
    enum { COLS = 512 };
    double acc[COLS];
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c0 = 0; c0 < inner; c0 += COLS) {
            int64_t nc = inner - c0 < COLS ? inner - c0 : COLS;
            for (int64_t c = 0; c < nc; c++)
                acc[c] = 0;
            for (int64_t j = 0; j < n; j++) {
                const float *xr = x + (a * n + j) * inner + c0;
                for (int64_t c = 0; c < nc; c++)
                    acc[c] += xr[c];
            }
            float *orow = o + a * inner + c0;
            for (int64_t c = 0; c < nc; c++)
                orow[c] = accumulate ? orow[c] + (float)acc[c] : (float)acc[c];
        }
}

/* o[i] = w[index[i]]: rows of an embedding, index_select along dim 0 */
static int gather_rows(const int32_t *p, void *const *bufs, int64_t *bad)
{
    return tnt_take(1, p[2], p[1], p[0], sizeof(float), 0, bufs[2], p[3], bufs[0], bufs[1], bad)
           ? TNT_ROWS_BAD_INDEX : TNT_ROWS_OK;
}

/* o[index[i]] += g[i] but for rows of padding_idx (zeros first unless accumulating).
   Indices out of range cannot come here: the forward lookup raised on them. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void embedding_grad(const int32_t *p, void *const *bufs)
{
    int64_t k = p[0], d = p[1], nw = p[2], padding = p[3];
    int index64 = p[4], accumulate = p[5];
    float *o = bufs[0];
    const float *g = bufs[1];
    if (!accumulate)
        memset(o, 0, (size_t)(nw * d) * sizeof(float));
    for (int64_t i = 0; i < k; i++) {
        int64_t r = tnt_index_at(bufs[2], index64, i);
        if (r == padding || r < 0 || r >= nw)
            continue;
        float *orow = o + r * d;
        const float *gr = g + i * d;
        for (int64_t j = 0; j < d; j++)
            orow[j] += gr[j];
    }
}

/* -x[i, t_i - lo] for the targets that fall in this tile of classes [lo, lo + c), 0
   for the others and for ignore_index; per row, or their sum. With classes, a
   target outside [0, classes) other than ignore_index fails the task. */
static int nll(const int32_t *p, void *const *bufs, int64_t *bad)
{
    int64_t k = p[0], c = p[1], lo = p[2], classes = p[3], ignore = p[4];
    int per_row = p[5];
    float *o = bufs[0];
    const float *x = bufs[1];
    const int64_t *t = bufs[2];
    if (classes)
        for (int64_t i = 0; i < k; i++)
            if ((t[i] < 0 || t[i] >= classes) && t[i] != ignore) {
                *bad = t[i];
                return TNT_ROWS_BAD_TARGET;
            }
    double s = 0;
    for (int64_t i = 0; i < k; i++) {
        int64_t j = t[i] - lo;
        float v = t[i] != ignore && j >= 0 && j < c ? -x[i * c + j] : 0.0f;
        if (per_row)
            o[i] = v;
        else
            s += v;
    }
    if (!per_row)
        o[0] = (float)s;
    return TNT_ROWS_OK;
}

/* how many targets are not ignore_index (the total weight without class weights) */
static void nll_weight(const int32_t *p, void *const *bufs)
{
    int64_t k = p[0], ignore = p[1], n = 0;
    const int64_t *t = bufs[1];
    for (int64_t i = 0; i < k; i++)
        n += t[i] != ignore;
    *(float *)bufs[0] = (float)n;
}

/* zeros but -g (g / total weight for the mean) at each row's target in this tile */
static void nll_grad(const int32_t *p, void *const *bufs)
{
    int64_t k = p[0], c = p[1], lo = p[2], ignore = p[3];
    int mean = p[4], per_row = p[5];
    float *o = bufs[0];
    const float *g = bufs[1];
    const int64_t *t = bufs[2];
    float tw = *(const float *)bufs[3];
    memset(o, 0, (size_t)(k * c) * sizeof(float));
    for (int64_t i = 0; i < k; i++) {
        int64_t j = t[i] - lo;
        if (t[i] == ignore || j < 0 || j >= c)
            continue;
        float gi = per_row ? g[i] : g[0];
        o[i * c + j] = -(mean ? gi / tw : gi);
    }
}

/* items lo on of start + i * step: in int64 for an int64 output, else in double
   rounded to float (as on CPU) */
static void arange(const int32_t *p, const double *consts, void *const *bufs)
{
    int64_t n = p[0], lo = p[2];
    if (p[1]) {
        int64_t start = (int64_t)consts[0], step = (int64_t)consts[1];
        int64_t *o = bufs[0];
        for (int64_t i = 0; i < n; i++)
            o[i] = (lo + i) * step + start;
    } else {
        float *o = bufs[0];
        for (int64_t i = 0; i < n; i++)
            o[i] = (float)((double)(lo + i) * consts[1] + consts[0]);
    }
}

int tnt_rows_run(int kind, const int32_t *p, const double *consts, void *const *bufs, int64_t *bad)
{
    switch (kind) {
    case TNT_ROWS_SOFTMAX: softmax(p, bufs); break;
    case TNT_ROWS_SOFTMAX_BACKWARD: softmax_backward(p, bufs); break;
    case TNT_ROWS_LAYER_NORM: layer_norm(p, consts, bufs); break;
    case TNT_ROWS_LAYER_NORM_GRAD: layer_norm_grad(p, bufs); break;
    case TNT_ROWS_COPY_BOXES: case TNT_ROWS_MAP: case TNT_ROWS_ANY: case TNT_ROWS_INDEX: case TNT_ROWS_INDEX_N:
    case TNT_ROWS_ISUM:
        return tnt_typed_run(kind, p, bufs, bad);
    case TNT_ROWS_INGRESS: {
        void *two[2] = { bufs[0], (void *)(uintptr_t)consts[0] };
        return tnt_typed_run(TNT_ROWS_COPY_BOXES, p, two, bad);
    }
    case TNT_ROWS_SUM: sum_middle(p, bufs); break;
    case TNT_ROWS_GATHER: return gather_rows(p, bufs, bad);
    case TNT_ROWS_EMBEDDING_GRAD: embedding_grad(p, bufs); break;
    case TNT_ROWS_NLL: return nll(p, bufs, bad);
    case TNT_ROWS_NLL_WEIGHT: nll_weight(p, bufs); break;
    case TNT_ROWS_NLL_GRAD: nll_grad(p, bufs); break;
    case TNT_ROWS_ARANGE: arange(p, consts, bufs); break;
    case TNT_ROWS_SGD: tnt_nn_sgd(p, consts, bufs); break;
    case TNT_ROWS_ADAMW: tnt_nn_adamw(p, consts, bufs); break;
    case TNT_ROWS_RMS_NORM: tnt_nn_rms_norm(p, consts, bufs); break;
    case TNT_ROWS_RMS_NORM_GRAD: tnt_nn_rms_norm_grad(p, bufs); break;
    case TNT_ROWS_ROPE: tnt_nn_rope(p, bufs); break;
    case TNT_ROWS_MAX_POOL2D: tnt_nn_max_pool2d(p, bufs); break;
    case TNT_ROWS_MAX_POOL2D_GRAD: return tnt_nn_max_pool2d_grad(p, bufs, bad);
    case TNT_ROWS_BN_STATS: tnt_nn_bn_stats(p, bufs); break;
    case TNT_ROWS_BN_SUMS: tnt_nn_bn_sums(p, bufs); break;
    case TNT_ROWS_BN_COMBINE: tnt_nn_bn_combine(p, consts, bufs); break;
    case TNT_ROWS_BN_GRAD_COMBINE: tnt_nn_bn_grad_combine(p, bufs); break;
    case TNT_ROWS_ATEN:
        return tnt_aten_run((const void *)(uintptr_t)consts[0], bufs, p[0]) ? TNT_ROWS_ATEN_FAILED : TNT_ROWS_OK;
    default: break;
    }
    return TNT_ROWS_OK;
}
