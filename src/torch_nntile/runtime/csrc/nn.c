/* The kernels of nn.h. They repeat the float32 arithmetic of the Python kernels they
   stand in for (ops/optim.py, ops/norm.py, ops/attention.py) operation by operation,
   as PyTorch's CPU kernels do it: an add with alpha, addcmul and lerp are one fused
   multiply-add (fmaf), every other operation is rounded on its own (hence no
   contraction here), scalars are rounded to float first. So an update matches the
   Python one to the bit but for the sums, which are accumulated in double.

   Outputs may be the very tiles of their inputs (element i is read before it is
   written), so the optimizer kernels take no restrict pointers. */
#pragma GCC optimize("fp-contract=off")
#include "nn.h"
#include "lanes.h"
#include "rows.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

/* torch's maximum: NaN of either operand kept */
static inline __attribute__((always_inline)) float nan_max(float a, float b)
{
    return a != a ? a : b != b ? b : a > b ? a : b;
}

/* sgd: n, momentum (writes buf), reads_buf, nesterov, maximize, weight_decay (0/1);
   consts -lr, momentum, 1 - dampening, weight_decay; buffers p_out, [buf_out], p, g, [buf] */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void tnt_nn_sgd(const int32_t *p, const double *consts, void *const *bufs)
{
    int64_t n = p[0];
    int momentum = p[1], reads_buf = p[2], nesterov = p[3], maximize = p[4], decay = p[5];
    float neg_lr = (float)consts[0], mom = (float)consts[1], keep = (float)consts[2], wd = (float)consts[3];
    int at = 0;
    float *po = bufs[at++];
    float *bo = momentum ? bufs[at++] : NULL;
    const float *pi = bufs[at++], *gi = bufs[at++];
    const float *bi = reads_buf ? bufs[at++] : NULL;
    for (int64_t i = 0; i < n; i++) {
        float pv = pi[i], g = maximize ? -gi[i] : gi[i];
        if (decay)
            g = fmaf(pv, wd, g);
        if (momentum) {
            float b = reads_buf ? fmaf(g, keep, bi[i] * mom) : g;
            bo[i] = b;
            g = nesterov ? fmaf(b, mom, g) : b;
        }
        po[i] = fmaf(g, neg_lr, pv);
    }
}

/* adamw: n, amsgrad, maximize, weight_decay, from_step (0/1); consts 1 - lr * weight_decay,
   1 - beta1, beta2, 1 - beta2, sqrt(bias correction 2), eps, -step_size; with from_step
   the fifth and last are beta1 and lr, and the bias corrections come from the step
   count in the last buffer (in double, as the host works them out);
   buffers p_out, m_out, v_out, [vmax_out], p, g, m, v, [vmax], [step] */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void tnt_nn_adamw(const int32_t *p, const double *consts, void *const *bufs)
{
    int64_t n = p[0];
    int amsgrad = p[1], maximize = p[2], decay = p[3], from_step = p[4];
    float keep = (float)consts[0], w = (float)consts[1], beta2 = (float)consts[2], c2 = (float)consts[3];
    float bc2 = (float)consts[4], eps = (float)consts[5], neg_step = (float)consts[6];
    int at = 0;
    float *po = bufs[at++], *mo = bufs[at++], *vo = bufs[at++];
    float *vmo = amsgrad ? bufs[at++] : NULL;
    const float *pi = bufs[at++], *gi = bufs[at++], *mi = bufs[at++], *vi = bufs[at++];
    const float *vmi = amsgrad ? bufs[at++] : NULL;
    if (from_step) {
        double step = *(const float *)bufs[at];
        bc2 = (float)sqrt(1.0 - pow(consts[2], step));
        neg_step = (float)(-(consts[6] / (1.0 - pow(consts[4], step))));
    }
    /* torch.lerp: start + w (end - start) for |w| < 0.5, else end + (w - 1) (end - start) */
    int small = fabsf(w) < 0.5f;
    float coeff = small ? w : w - 1.0f;
    for (int64_t i = 0; i < n; i++) {
        float g = maximize ? -gi[i] : gi[i], m = mi[i];
        float pv = decay ? pi[i] * keep : pi[i];
        float mn = fmaf(coeff, g - m, small ? m : g);
        float v = fmaf(c2 * g, g, vi[i] * beta2);
        mo[i] = mn;
        vo[i] = v;
        if (amsgrad)
            vmo[i] = v = nan_max(vmi[i], v);
        float denom = sqrtf(v) / bc2 + eps;
        po[i] = pv + neg_step * mn / denom;
    }
}

/* rms norm: rows, n, has_w; consts eps; buffers y, rstd, x, [w] */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void tnt_nn_rms_norm(const int32_t *p, const double *consts, void *const *bufs)
{
    int64_t rows = p[0], n = p[1];
    int has_w = p[2];
    float *y = bufs[0], *rstd = bufs[1];
    const float *x = bufs[2], *w = has_w ? bufs[3] : NULL;
    float eps = (float)consts[0];
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = y + r * n;
        float ms = (float)(sqdev8(xr, 0.0f, n) / (double)n);
        float rs = 1.0f / sqrtf(ms + eps);
        rstd[r] = rs;
        if (has_w)
            for (int64_t j = 0; j < n; j++) {
                float v = xr[j] * rs;
                yr[j] = v * w[j];
            }
        else
            for (int64_t j = 0; j < n; j++)
                yr[j] = xr[j] * rs;
    }
}

/* rms norm gradient: rows, n, which, has_w, accumulate; buffers o, g, x, rstd, [w].
   which 0 (input): rstd (g w - xhat mean(g w xhat)); 1 (weight): g xhat summed over rows */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void tnt_nn_rms_norm_grad(const int32_t *p, void *const *bufs)
{
    int64_t rows = p[0], n = p[1];
    int which = p[2], has_w = p[3], accumulate = p[4];
    float *o = bufs[0];
    const float *g = bufs[1], *x = bufs[2], *rstd = bufs[3], *w = has_w ? bufs[4] : NULL;
    if (which == 0) {
        for (int64_t r = 0; r < rows; r++) {
            const float *gr = g + r * n, *xr = x + r * n;
            float *orow = o + r * n;
            float rs = rstd[r];
            double gsum, c;
            gw_sums8(gr, w, xr, 0.0f, rs, n, &gsum, &c);  /* c: sum(g w xhat) */
            float cn = (float)(c / (double)n);
            for (int64_t j = 0; j < n; j++) {
                float gw = has_w ? gr[j] * w[j] : gr[j], xh = xr[j] * rs, t = xh * cn;
                float v = rs * (gw - t);
                orow[j] = accumulate ? orow[j] + v : v;
            }
        }
        return;
    }
    enum { COLS = 512 };
    double acc[COLS];
    for (int64_t j0 = 0; j0 < n; j0 += COLS) {
        int64_t nc = n - j0 < COLS ? n - j0 : COLS;
        for (int64_t j = 0; j < nc; j++)
            acc[j] = 0;
        for (int64_t r = 0; r < rows; r++) {
            const float *gr = g + r * n + j0, *xr = x + r * n + j0;
            float rs = rstd[r];
            for (int64_t j = 0; j < nc; j++) {
                float xh = xr[j] * rs, v = gr[j] * xh;
                acc[j] += v;
            }
        }
        for (int64_t j = 0; j < nc; j++)
            o[j0 + j] = accumulate ? o[j0 + j] + (float)acc[j] : (float)acc[j];
    }
}

/* rope: b, s, d, h, per_batch, transpose; buffers y, x [b, s, d, h], cos, sin ([s, d],
   or [b, s, d] with per_batch). Forward [x1 c1 - x2 s1, x2 c2 + x1 s2], transpose
   [x1 c1 + x2 s2, x2 c2 - x1 s1], each the product then one addcmul. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void tnt_nn_rope(const int32_t *p, void *const *bufs)
{
    int64_t nb = p[0], ns = p[1], nd = p[2], nh = p[3], half = nd / 2;
    int per_batch = p[4], transpose = p[5];
    float *restrict y = bufs[0];
    const float *restrict x = bufs[1], *cs = bufs[2], *sn = bufs[3];
    for (int64_t b = 0; b < nb; b++)
        for (int64_t s = 0; s < ns; s++) {
            int64_t row = (per_batch ? b * ns + s : s) * nd;
            const float *c = cs + row, *si = sn + row;
            for (int64_t j = 0; j < half; j++) {
                int64_t at1 = ((b * ns + s) * nd + j) * nh, at2 = at1 + half * nh;
                const float *x1 = x + at1, *x2 = x + at2;
                float *y1 = y + at1, *y2 = y + at2;
                float c1 = c[j], c2 = c[j + half], s1 = si[j], s2 = si[j + half];
                if (transpose)
                    for (int64_t k = 0; k < nh; k++) {
                        y1[k] = fmaf(x2[k], s2, x1[k] * c1);
                        y2[k] = fmaf(-x1[k], s1, x2[k] * c2);
                    }
                else
                    for (int64_t k = 0; k < nh; k++) {
                        y1[k] = fmaf(-x2[k], s1, x1[k] * c1);
                        y2[k] = fmaf(x1[k], s2, x2[k] * c2);
                    }
            }
        }
}

int tnt_nn_check(int kind, const int32_t *p, int nints, int nbuf)
{
    switch (kind) {
    case TNT_ROWS_MAX_POOL2D:  /* sizes and padding never negative, the rest at least 1 */
        if (nints != 13 || nbuf != 3)
            return -1;
        for (int i = 0; i < 13; i++)
            if (p[i] < (i < 5 || i == 9 || i == 10 ? 0 : 1))
                return -1;
        return 0;
    case TNT_ROWS_MAX_POOL2D_GRAD:
    case TNT_ROWS_BN_STATS:
    case TNT_ROWS_BN_SUMS: {
        int want = kind == TNT_ROWS_MAX_POOL2D_GRAD ? 5 : 3;
        if (nints != want || nbuf != (kind == TNT_ROWS_MAX_POOL2D_GRAD ? 4 : kind == TNT_ROWS_BN_STATS ? 3 : 6))
            return -1;
        for (int i = 0; i < want; i++)
            if (p[i] < 0)
                return -1;
        return 0;
    }
    case TNT_ROWS_BN_COMBINE: {  /* c, k, has_w, has_b, has_r, sizes[k] */
        if (nints < 5 || p[0] < 0 || p[1] < 1 || nints != 5 + p[1])
            return -1;
        for (int i = 2; i < 5; i++)
            if (p[i] < 0 || p[i] > 1)
                return -1;
        for (int i = 0; i < p[1]; i++)
            if (p[5 + i] < 0)
                return -1;
        return nbuf == 4 + 4 * p[4] + p[2] + p[3] + 2 * p[1] ? 0 : -1;
    }
    case TNT_ROWS_BN_GRAD_COMBINE:  /* c, k, has_w, n */
        if (nints != 4 || p[0] < 0 || p[1] < 1 || p[2] < 0 || p[2] > 1 || p[3] < 0)
            return -1;
        return nbuf == 6 + p[2] + 2 * p[1] ? 0 : -1;
    default:
        return -1;
    }
}

/* take v (at position k) where it is greater than the maximum so far, or NaN */
static inline __attribute__((always_inline)) void take_max(float v, int64_t k, float *m, int64_t *at)
{
    int t = v > *m || v != v;
    *m = t ? v : *m;
    *at = t ? k : *at;
}

typedef int32_t tnt_mask8 __attribute__((vector_size(32)));

/* take_max on eight windows at once: where v is greater than m or NaN, m becomes v and
   the offset o becomes k (branch-free: random values made the branches of the scalar
   code cost 10 ns an output) */
#define TAKE8(v, k)                                                      \
    do {                                                                 \
        tnt_mask8 t_ = ((v) > m) | ((v) != (v));                         \
        m = (tnt_lanes)(((tnt_mask8)(v) & t_) | ((tnt_mask8)m & ~t_));  \
        o = ((k) & t_) | (o & ~t_);                                      \
    } while (0)

/* the 2x2 windows of stride 2 over rows r0 and r1 (w wide), outputs j0 <= j < ow of
   output row i, eight at a time; returns where it stopped */
static inline __attribute__((always_inline)) int64_t pool2x2_row8(const float *r0, const float *r1, int64_t w,
                                                                 int64_t i, int64_t ow, float *yr, int64_t *ir)
{
    const tnt_mask8 even = { 0, 2, 4, 6, 8, 10, 12, 14 }, odd = even + 1;
    int64_t j = 0;
    for (; j + 8 <= ow; j += 8) {
        tnt_lanes a0 = LANES_AT(r0 + 2 * j), a1 = LANES_AT(r0 + 2 * j + 8);
        tnt_lanes b0 = LANES_AT(r1 + 2 * j), b1 = LANES_AT(r1 + 2 * j + 8);
        tnt_lanes m = __builtin_shuffle(a0, a1, even);
        tnt_mask8 o = { 0 };
        tnt_lanes v = __builtin_shuffle(a0, a1, odd);
        TAKE8(v, 1);
        v = __builtin_shuffle(b0, b1, even);
        TAKE8(v, (int32_t)w);
        v = __builtin_shuffle(b0, b1, odd);
        TAKE8(v, (int32_t)w + 1);
        *(tnt_lanes_u *)(yr + j) = m;
        for (int l = 0; l < 8; l++)
            ir[j + l] = 2 * i * w + 2 * (j + l) + o[l];
    }
    return j;
}

/* max pool 2-d: planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw; buffers y, indices
   (int64), x. Each window from its first in-range row and column (start at -inf),
   read row by row; the common 2x2 windows of stride 2 without padding on their own. */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void tnt_nn_max_pool2d(const int32_t *p, void *const *bufs)
{
    int64_t planes = p[0], h = p[1], w = p[2], oh = p[3], ow = p[4];
    int64_t kh = p[5], kw = p[6], sh = p[7], sw = p[8], ph = p[9], pw = p[10], dh = p[11], dw = p[12];
    float *y = bufs[0];
    int64_t *ind = bufs[1];
    const float *x = bufs[2];
    int pairs = kh == 2 && kw == 2 && sh == 2 && sw == 2 && ph == 0 && pw == 0 && dh == 1 && dw == 1
                && 2 * oh <= h && 2 * ow <= w;
    for (int64_t c = 0; c < planes; c++) {
        const float *xp = x + c * h * w;
        float *yp = y + c * oh * ow;
        int64_t *ip = ind + c * oh * ow;
        for (int64_t i = 0; i < oh; i++) {
            if (pairs) {
                const float *r0 = xp + 2 * i * w, *r1 = r0 + w;
                for (int64_t j = w < INT32_MAX / 2 ? pool2x2_row8(r0, r1, w, i, ow, yp + i * ow, ip + i * ow) : 0;
                     j < ow; j++) {
                    int64_t k = 2 * i * w + 2 * j;
                    float m = r0[2 * j];  /* beats -inf or is NaN, else is -inf: taken either way */
                    int64_t at = k;
                    take_max(r0[2 * j + 1], k + 1, &m, &at);
                    take_max(r1[2 * j], k + w, &m, &at);
                    take_max(r1[2 * j + 1], k + w + 1, &m, &at);
                    yp[i * ow + j] = m;
                    ip[i * ow + j] = at;
                }
                continue;
            }
            int64_t i0 = i * sh - ph, i1 = i0 + (kh - 1) * dh + 1;
            i1 = i1 < h ? i1 : h;
            while (i0 < 0)
                i0 += dh;
            for (int64_t j = 0; j < ow; j++) {
                int64_t j0 = j * sw - pw, j1 = j0 + (kw - 1) * dw + 1;
                j1 = j1 < w ? j1 : w;
                while (j0 < 0)
                    j0 += dw;
                float m = -INFINITY;
                int64_t at = i0 * w + j0;
                for (int64_t a = i0; a < i1; a += dh)
                    for (int64_t b = j0; b < j1; b += dw)
                        take_max(xp[a * w + b], a * w + b, &m, &at);
                yp[i * ow + j] = m;
                ip[i * ow + j] = at;
            }
        }
    }
}

/* max pool 2-d gradient: planes, h, w, oh, ow; buffers gi, g, x (not read), indices */
int tnt_nn_max_pool2d_grad(const int32_t *p, void *const *bufs, int64_t *bad)
{
    int64_t planes = p[0], hw = (int64_t)p[1] * p[2], ohw = (int64_t)p[3] * p[4];
    float *gi = bufs[0];
    const float *g = bufs[1];
    const int64_t *ind = bufs[3];
    memset(gi, 0, (size_t)(planes * hw) * sizeof(float));
    for (int64_t c = 0; c < planes; c++)
        for (int64_t o = 0; o < ohw; o++) {
            int64_t k = ind[c * ohw + o];
            if (k == -1)
                continue;
            if (k < 0 || k >= hw) {
                bad[0] = k;
                return TNT_ROWS_BAD_INDEX;
            }
            gi[c * hw + k] += g[c * ohw + o];
        }
    return TNT_ROWS_OK;
}

/* batch norm statistics of a tile: outer, c, inner; buffers mean[c], m2[c], x[outer, c, inner].
   Two passes over each channel (its sum, then the squared deviations from its mean). */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void tnt_nn_bn_stats(const int32_t *p, void *const *bufs)
{
    int64_t outer = p[0], c = p[1], inner = p[2];
    float *mean = bufs[0], *m2 = bufs[1];
    const float *x = bufs[2];
    double n = (double)outer * (double)inner;
    for (int64_t ch = 0; ch < c; ch++) {
        if (n == 0) {  /* as the mean and variance of nothing: NaN */
            mean[ch] = m2[ch] = NAN;
            continue;
        }
        double s = 0, d = 0;
        for (int64_t b = 0; b < outer; b++)
            s += sum8(x + (b * c + ch) * inner, inner);
        float mu = (float)(s / n);
        for (int64_t b = 0; b < outer; b++)
            d += sqdev8(x + (b * c + ch) * inner, mu, inner);
        mean[ch] = mu;
        m2[ch] = (float)d;
    }
}

/* batch norm backward sums of a tile: outer, c, inner; buffers sg[c], sgx[c], g, x, mean, invstd */
__attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
void tnt_nn_bn_sums(const int32_t *p, void *const *bufs)
{
    int64_t outer = p[0], c = p[1], inner = p[2];
    float *sg = bufs[0], *sgx = bufs[1];
    const float *g = bufs[2], *x = bufs[3], *mean = bufs[4], *rs = bufs[5];
    for (int64_t ch = 0; ch < c; ch++) {
        double a = 0, t = 0;
        for (int64_t b = 0; b < outer; b++) {
            double a1, t1;
            int64_t off = (b * c + ch) * inner;
            gw_sums8(g + off, NULL, x + off, mean[ch], rs[ch], inner, &a1, &t1);
            a += a1;
            t += t1;
        }
        sg[ch] = (float)a;
        sgx[ch] = (float)t;
    }
}

/* batch norm's statistics of a channel tile from its tiles' parts: c, k, has_w, has_b,
   has_r, sizes[k]; consts eps, momentum; buffers as rows.h lists. The parts are combined
   in double (Chan's formula), the rest in float as the Python kernel (ops/batch_norm.py). */
void tnt_nn_bn_combine(const int32_t *p, const double *consts, void *const *bufs)
{
    int64_t c = p[0], k = p[1];
    int has_w = p[2], has_b = p[3], has_r = p[4];
    const int32_t *sizes = p + 5;
    float eps = (float)consts[0], mom = (float)consts[1], keep = (float)(1.0 - consts[1]);
    int at = 0;
    float *m = bufs[at++], *r = bufs[at++], *alpha = bufs[at++], *beta = bufs[at++];
    float *new_rm = has_r ? bufs[at++] : NULL, *new_rv = has_r ? bufs[at++] : NULL;
    const float *w = has_w ? bufs[at++] : NULL, *b = has_b ? bufs[at++] : NULL;
    const float *old_rm = has_r ? bufs[at++] : NULL, *old_rv = has_r ? bufs[at++] : NULL;
    void *const *pm = bufs + at, *const *pm2 = bufs + at + k;
    double n = 0;
    for (int64_t i = 0; i < k; i++)
        n += sizes[i];
    float unbias = (float)(n / (n - 1 > 1 ? n - 1 : 1));
    for (int64_t j = 0; j < c; j++) {
        double s = 0, d = 0;
        for (int64_t i = 0; i < k; i++)
            s += sizes[i] * (double)((const float *)pm[i])[j];
        double mean = s / n;
        for (int64_t i = 0; i < k; i++) {
            double dev = ((const float *)pm[i])[j] - mean;
            d += ((const float *)pm2[i])[j] + sizes[i] * dev * dev;
        }
        float mu = (float)mean, var = (float)(d / n);
        float rs = 1.0f / sqrtf(var + eps);
        float a = has_w ? rs * w[j] : rs;
        m[j] = mu;
        r[j] = rs;
        alpha[j] = a;
        beta[j] = has_b ? b[j] - mu * a : -(mu * a);
        if (has_r) {
            new_rm[j] = old_rm[j] * keep + mu * mom;
            new_rv[j] = old_rv[j] * keep + var * unbias * mom;
        }
    }
}

/* batch norm backward's sums of a channel tile from its tiles' parts, and the input
   gradient's coefficients: c, k, has_w, n; buffers as rows.h lists */
void tnt_nn_bn_grad_combine(const int32_t *p, void *const *bufs)
{
    int64_t c = p[0], k = p[1];
    int has_w = p[2];
    float n = (float)p[3];
    float *sg = bufs[0], *sgx = bufs[1], *c0 = bufs[2], *kk = bufs[3], *a = bufs[4];
    const float *rs = bufs[5], *w = has_w ? bufs[6] : NULL;
    void *const *parts = bufs + 6 + has_w;
    for (int64_t j = 0; j < c; j++) {
        double s = 0, t = 0;
        for (int64_t i = 0; i < k; i++) {
            s += ((const float *)parts[i])[j];
            t += ((const float *)parts[k + i])[j];
        }
        sg[j] = (float)s;
        sgx[j] = (float)t;
        c0[j] = sg[j] / n;
        kk[j] = sgx[j] * rs[j] / n;
        a[j] = has_w ? rs[j] * w[j] : rs[j];
    }
}
