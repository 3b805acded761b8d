/* The elementwise program interpreter of ew.h. Blocks of BLOCK elements: per block
   each operand is a pointer to BLOCK consecutive float32 values (the tile itself when
   it is float32 of stride 1, else a gathered, broadcast or converted copy), and each step is a tight loop the
   compiler vectorizes. */
#include "ew.h"
#include "fmath.h"
#include "typed.h"
#include "walk.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define BLOCK 256

_Static_assert(TNT_EW_MAXDIM == TNT_WALK_MAXDIM, "programs walk their dims with walk.h");

int tnt_ew_check(const int32_t *prog, int nints, int nconst, int nbuf)
{
    if (nints < 3)
        return -1;
    int nb = prog[0], nd = prog[1];
    if (nb != nbuf || nb < 1 || nb > TNT_EW_CONST || nd < 1 || nd > TNT_EW_MAXDIM)
        return -1;
    int at = 2 + nd + nb * nd + 2 * nb;
    if (nints < at + 1 || prog[at - 2 * nb] != 0 || prog[at - nb] != TNT_EW_F32)  /* the output: its tile, float32 */
        return -1;
    const int32_t *types = prog + at - nb;
    for (int b = 1; b < nb; b++) {
        if (types[b] == TNT_EW_OUT) {  /* written as the output is: its strides, at its start */
            if (prog[at - 2 * nb + b] != 0)
                return -1;
            for (int d = 0; d < nd; d++)
                if (prog[2 + nd + b * nd + d] != prog[2 + nd + d])
                    return -1;
        } else if (types[b] != TNT_EW_F32 && types[b] != TNT_EW_BOOL) {
            return -1;
        }
    }
    int ns = prog[at];
    if (ns < 1 || ns > TNT_EW_MAXSTEPS || nints != at + 1 + 5 * ns)
        return -1;
    int64_t want = 1;
    for (int d = nd - 1; d >= 0; d--) {  /* the output is contiguous */
        if (prog[2 + d] < 0 || (prog[2 + d] > 1 && prog[2 + nd + d] != want))
            return -1;
        want *= prog[2 + d];
    }
    const int32_t *st = prog + at + 1;
    int stored[TNT_EW_CONST] = {0};
    for (int s = 0; s < ns; s++) {
        int op = st[5 * s];
        if (op < 0 || op >= TNT_EW_NOPS)
            return -1;
        for (int k = 1; k < 5; k++) {
            int r = st[5 * s + k];
            if (r < 0)
                continue;  /* unused slot */
            if (r < TNT_EW_CONST ? r >= nb
                : r < TNT_EW_TEMP ? r - TNT_EW_CONST >= nconst : r - TNT_EW_TEMP >= s)
                return -1;
            int dest = op == TNT_EW_STORE && k == 2;
            if (r < TNT_EW_CONST && r > 0 && (types[r] == TNT_EW_OUT) != dest)
                return -1;  /* a written buffer is never read, and only written buffers are stored to */
            if (r >= TNT_EW_TEMP && st[5 * (r - TNT_EW_TEMP)] == TNT_EW_STORE)
                return -1;  /* a store has no result of its own */
            if (dest)
                stored[r]++;
        }
        if (op == TNT_EW_STORE && (s == ns - 1 || st[5 * s + 1] < 0 || st[5 * s + 2] < 1 || st[5 * s + 2] >= nb))
            return -1;  /* the last step writes the output */
    }
    for (int b = 1; b < nb; b++)
        if ((types[b] == TNT_EW_OUT) != (stored[b] == 1))
            return -1;  /* every written buffer gets its value once */
    return 0;
}

static inline __attribute__((always_inline)) float fsigmoid(float x) { return 1.0f / (1.0f + fexp(-x)); }

/* At +inf and -0, PyTorch's CPU kernel gives what its vector code gives on the
   machine (NaN or inf, -0 or +0): the program passes those values in. */
static inline __attribute__((always_inline)) float gelu(float x, float at_inf, float at_zero)
{
    if (x == __builtin_inff()) return at_inf;
    if (x == 0.0f) return signbit(x) ? at_zero : x;
    return 0.5f * x * (1.0f + erff(x * (float)M_SQRT1_2));
}

static inline __attribute__((always_inline)) float gelu_tanh(float x)
{
    const float k = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), c = 0.044715f;
    float inner = k * (x + c * x * x * x);
    return 0.5f * x * (1.0f + ftanh(inner));
}

/* The derivatives as PyTorch's CPU kernels write them: the exact one from the normal
   distribution's cdf and pdf, the tanh one by the product rule on 0.5 x (1 + tanh u). */
static inline __attribute__((always_inline)) float gelu_grad(float x)
{
    float cdf = 0.5f * (1.0f + erff(x * (float)M_SQRT1_2));
    float pdf = fexp(-0.5f * x * x) * (float)(M_2_SQRTPI * M_SQRT1_2 * 0.5);
    return cdf + x * pdf;
}

static inline __attribute__((always_inline)) float gelu_tanh_grad(float x)
{
    const float k = (float)(M_SQRT2 * M_2_SQRTPI * 0.5), c = 0.044715f;
    float x2 = x * x;
    float t = ftanh(k * (x + c * x2 * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * k * (1.0f + 3.0f * c * x2);
}

static inline __attribute__((always_inline)) float lerp(float a, float b, float w)
{
    return fabsf(w) < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

/* Built for AVX-512 and AVX2 as well as the baseline, picked at load time. */
__attribute__((target_clones("avx512f", "avx2", "default")))
static void step(int op, int n, float *restrict o, const float *a, const float *b, const float *c,
                 const float *d)
{
    int i;
    switch (op) {
    case TNT_EW_COPY: memmove(o, a, n * sizeof(float)); break;
    case TNT_EW_ADD: for (i = 0; i < n; i++) o[i] = a[i] + b[i]; break;
    case TNT_EW_SUB: for (i = 0; i < n; i++) o[i] = a[i] - b[i]; break;
    case TNT_EW_MUL: for (i = 0; i < n; i++) o[i] = a[i] * b[i]; break;
    case TNT_EW_DIV: for (i = 0; i < n; i++) o[i] = a[i] / b[i]; break;
    case TNT_EW_ADD_SCALED: for (i = 0; i < n; i++) o[i] = a[i] + c[i] * b[i]; break;
    case TNT_EW_SUB_SCALED: for (i = 0; i < n; i++) o[i] = a[i] - c[i] * b[i]; break;
    case TNT_EW_ADDCMUL: for (i = 0; i < n; i++) o[i] = a[i] + d[i] * b[i] * c[i]; break;
    case TNT_EW_ADDCDIV: for (i = 0; i < n; i++) o[i] = a[i] + d[i] * b[i] / c[i]; break;
    case TNT_EW_LERP: for (i = 0; i < n; i++) o[i] = lerp(a[i], b[i], c[i]); break;
    case TNT_EW_NEG: for (i = 0; i < n; i++) o[i] = -a[i]; break;
    case TNT_EW_ABS: for (i = 0; i < n; i++) o[i] = fabsf(a[i]); break;
    case TNT_EW_SQRT: for (i = 0; i < n; i++) o[i] = sqrtf(a[i]); break;
    case TNT_EW_RSQRT: for (i = 0; i < n; i++) o[i] = 1.0f / sqrtf(a[i]); break;
    case TNT_EW_RECIPROCAL: for (i = 0; i < n; i++) o[i] = 1.0f / a[i]; break;
    case TNT_EW_EXP: for (i = 0; i < n; i++) o[i] = fexp(a[i]); break;
    case TNT_EW_LOG: for (i = 0; i < n; i++) o[i] = logf(a[i]); break;
    case TNT_EW_TANH: for (i = 0; i < n; i++) o[i] = ftanh(a[i]); break;
    case TNT_EW_SIGMOID: for (i = 0; i < n; i++) o[i] = fsigmoid(a[i]); break;
    case TNT_EW_POW:
        for (i = 0; i < n; i++) {
            float e = b[i], x = a[i];
            o[i] = e == 2.0f ? x * x : e == 3.0f ? x * x * x : e == 0.5f ? sqrtf(x)
                 : e == 1.0f ? x : e == -1.0f ? 1.0f / x : e == -2.0f ? 1.0f / (x * x) : powf(x, e);
        }
        break;
    case TNT_EW_TANH_BACKWARD: for (i = 0; i < n; i++) o[i] = a[i] * (1.0f - b[i] * b[i]); break;
    case TNT_EW_SIGMOID_BACKWARD: for (i = 0; i < n; i++) o[i] = a[i] * ((1.0f - b[i]) * b[i]); break;
    case TNT_EW_THRESHOLD_BACKWARD: for (i = 0; i < n; i++) o[i] = b[i] <= c[i] ? 0.0f : a[i]; break;
    case TNT_EW_CLAMP_MIN: for (i = 0; i < n; i++) o[i] = isnan(a[i]) ? a[i] : a[i] < b[i] ? b[i] : a[i]; break;
    case TNT_EW_CLAMP_MAX: for (i = 0; i < n; i++) o[i] = isnan(a[i]) ? a[i] : a[i] > b[i] ? b[i] : a[i]; break;
    case TNT_EW_MAXIMUM:
        for (i = 0; i < n; i++) o[i] = isnan(a[i]) || isnan(b[i]) ? a[i] + b[i] : a[i] > b[i] ? a[i] : b[i];
        break;
    case TNT_EW_MINIMUM:
        for (i = 0; i < n; i++) o[i] = isnan(a[i]) || isnan(b[i]) ? a[i] + b[i] : a[i] < b[i] ? a[i] : b[i];
        break;
    case TNT_EW_GELU: for (i = 0; i < n; i++) o[i] = gelu(a[i], b[i], c[i]); break;
    case TNT_EW_GELU_TANH: for (i = 0; i < n; i++) o[i] = gelu_tanh(a[i]); break;
    case TNT_EW_SILU: for (i = 0; i < n; i++) o[i] = a[i] / (1.0f + fexp(-a[i])); break;
    case TNT_EW_WHERE: for (i = 0; i < n; i++) o[i] = a[i] != 0.0f ? b[i] : c[i]; break;
    case TNT_EW_SIN: for (i = 0; i < n; i++) o[i] = sinf(a[i]); break;
    case TNT_EW_COS: for (i = 0; i < n; i++) o[i] = cosf(a[i]); break;
    case TNT_EW_GELU_BACKWARD: for (i = 0; i < n; i++) o[i] = a[i] * gelu_grad(b[i]); break;
    case TNT_EW_GELU_TANH_BACKWARD: for (i = 0; i < n; i++) o[i] = a[i] * gelu_tanh_grad(b[i]); break;
    case TNT_EW_STORE: memmove((float *)b, a, n * sizeof(float)); break;
    default: break;
    }
}

static __thread float temp[TNT_EW_MAXSTEPS][BLOCK];
static __thread float gathered[TNT_EW_CONST][BLOCK];

/* Element ``off`` of a buffer of ``type``. */
static inline const char *elem(const void *buf, int type, int64_t off)
{
    return (const char *)buf + off * (type == TNT_EW_BOOL ? 1 : (int64_t)sizeof(float));
}

/* n values of ``type``, stride apart from p, to q as float32 (a bool as 0 or 1). */
static inline void copy_row(float *q, const char *p, int type, int64_t n, int64_t stride)
{
    if (type == TNT_EW_BOOL) {
        const uint8_t *u = (const uint8_t *)p;
        for (int64_t i = 0; i < n; i++)
            q[i] = u[i * stride] != 0;
    } else if (stride == 1) {
        memcpy(q, p, n * sizeof(float));
    } else {
        const float *f = (const float *)p;
        for (int64_t i = 0; i < n; i++)
            q[i] = f[i * stride];
    }
}

/* The steps over n values: operands src (index < TNT_EW_CONST), constants cval, the
   last step writing out. A step with a buffer in into[s] (> 0) writes its values
   there, as its TNT_EW_STORE would copy them; such a store (into -1) is skipped. */
static void run_steps(const int32_t *steps, int ns, int n, float *out, const float *const *src,
                      float (*cval)[BLOCK], const int8_t *into)
{
    const float *at[TNT_EW_MAXSTEPS];  /* where each step's values are */
    for (int s = 0; s < ns; s++) {
        if (into[s] < 0)
            continue;
        const float *ops[4];
        for (int k = 0; k < 4; k++) {
            int r = steps[5 * s + 1 + k];
            ops[k] = r < 0 ? NULL : r < TNT_EW_CONST ? src[r]
                   : r < TNT_EW_TEMP ? cval[r - TNT_EW_CONST] : at[r - TNT_EW_TEMP];
        }
        float *o = s == ns - 1 ? out : into[s] > 0 ? (float *)src[into[s]] : temp[s];
        step(steps[5 * s], n, o, ops[0], ops[1], ops[2], ops[3]);
        at[s] = o;
    }
}

/* into[] of run_steps: a step whose values one TNT_EW_STORE copies to a buffer writes
   them there itself (a pass over a block less per further result). */
static void plan_stores(const int32_t *steps, int ns, int8_t *into)
{
    for (int k = 0; k < ns; k++)
        into[k] = 0;
    for (int k = 0; k < ns; k++) {
        int a = steps[5 * k + 1] - TNT_EW_TEMP;
        if (steps[5 * k] != TNT_EW_STORE || a < 0 || steps[5 * a] == TNT_EW_STORE || into[a] != 0)
            continue;  /* a buffer's or constant's values, or a step's stored twice: copied */
        into[a] = (int8_t)steps[5 * k + 2];
        into[k] = -1;
    }
}

/* The index over dims 0..nd-1 of shape of the row ``row`` (the last dim fastest). */
static void unravel(int64_t *idx, int64_t row, const int64_t *shape, int nd)
{
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = row % shape[d];
        row /= shape[d];
    }
}

/* Rows shorter than half a block (a head's 32 values, say): the rows of a block are
   gathered first, so the steps run once a block instead of once a row. The output is
   contiguous, so its rows lie one after another. Runs rows [first, end), first a
   multiple of the rows a block holds. */
static void run_short_rows(int nb, int nd, const int64_t *shape, int64_t (*str)[TNT_EW_MAXDIM],
                           const int32_t *offsets, const int32_t *types, const int32_t *steps, int ns,
                           float (*cval)[BLOCK], const int8_t *into, void *const *bufs, int64_t first,
                           int64_t end)
{
    int64_t inner = shape[nd - 1];
    int64_t rows = BLOCK / inner;
    int64_t idx[TNT_EW_MAXDIM];
    const float *src[TNT_EW_CONST];
    unravel(idx, first, shape, nd - 1);
    for (int64_t o0 = first; o0 < end; o0 += rows) {
        int64_t r = end - o0 < rows ? end - o0 : rows;
        float *out = (float *)bufs[0] + o0 * inner;
        for (int64_t k = 0; k < r; k++) {
            for (int b = 1; b < nb; b++)
                if (types[b] != TNT_EW_OUT)  /* written in place */
                    copy_row(gathered[b] + k * inner,
                             elem(bufs[b], types[b], tnt_offset_of(offsets[b], idx, str[b], nd - 1)),
                             types[b], inner, str[b][nd - 1]);
            tnt_next_index(idx, shape, nd - 1);
        }
        src[0] = out;
        for (int b = 1; b < nb; b++)
            src[b] = types[b] == TNT_EW_OUT ? (float *)bufs[b] + o0 * inner : gathered[b];
        run_steps(steps, ns, (int)(r * inner), out, src, cval, into);
    }
}

/* Whether a program is one float32 copy of buffer 1 (a permutation, a strided view):
   it runs as one strided copy, whole. ``types`` and ``steps`` as tnt_ew_run_part finds them. */
static int strided_copy(int nb, int ns, const int32_t *types, const int32_t *steps)
{
    return nb == 2 && ns == 1 && steps[0] == TNT_EW_COPY && steps[1] == 1 && types[1] == TNT_EW_F32;
}

int64_t tnt_ew_cost(const int32_t *prog)
{
    int nb = prog[0], nd = prog[1];
    int64_t total = 1;
    for (int d = 0; d < nd; d++)
        total *= prog[2 + d];
    const int32_t *types = prog + 2 + nd + nb * nd + nb, *steps = types + nb + 1;
    return strided_copy(nb, steps[-1], types, steps) ? 0 : total * steps[-1];
}

void tnt_ew_run(const int32_t *prog, const double *consts, void *const *bufs)
{
    tnt_ew_run_part(prog, consts, bufs, 0, 1);
}

void tnt_ew_run_part(const int32_t *prog, const double *consts, void *const *bufs, int part, int nparts)
{
    int nb = prog[0], nd = prog[1];
    int64_t shape[TNT_EW_MAXDIM], str[TNT_EW_CONST][TNT_EW_MAXDIM];
    int64_t total = 1;
    for (int d = 0; d < nd; d++) {
        shape[d] = prog[2 + d];
        total *= shape[d];
        for (int b = 0; b < nb; b++)
            str[b][d] = prog[2 + nd + b * nd + d];
    }
    if (total == 0)
        return;
    const int32_t *offsets = prog + 2 + nd + nb * nd, *types = offsets + nb, *steps = types + nb + 1;
    int ns = steps[-1];
    if (strided_copy(nb, ns, types, steps)) {  /* tnt_ew_cost 0: never split */
        if (part == 0)
            tnt_copy_strided(sizeof(float), nd, shape, str, bufs[0], (const float *)bufs[1] + offsets[1]);
        return;
    }
    nd = tnt_collapse(nd, nb, shape, str);

    float cval[TNT_EW_TEMP - TNT_EW_CONST][BLOCK];  /* constants as blocks, made once */
    int nconst_used = 0;
    for (int s = 0; s < ns; s++)
        for (int k = 1; k < 5; k++) {
            int r = steps[5 * s + k];
            if (r >= TNT_EW_CONST && r < TNT_EW_TEMP && r - TNT_EW_CONST + 1 > nconst_used)
                nconst_used = r - TNT_EW_CONST + 1;
        }
    for (int c = 0; c < nconst_used; c++) {
        float v = (float)consts[c];
        for (int i = 0; i < BLOCK; i++)
            cval[c][i] = v;
    }
    int8_t into[TNT_EW_MAXSTEPS];
    plan_stores(steps, ns, into);
    /* The work is split in units the whole run walks too (a block of short rows, or a
       block of a row), so every element meets the same code either way. */
    int64_t inner = shape[nd - 1], outer = total / inner;
    if (inner < BLOCK / 2 && outer > 1) {
        int64_t rows = BLOCK / inner, units = (outer + rows - 1) / rows;
        int64_t first = units * part / nparts * rows, end = units * (part + 1) / nparts * rows;
        run_short_rows(nb, nd, shape, str, offsets, types, steps, ns, cval, into, bufs, first,
                       end < outer ? end : outer);
        return;
    }
    int64_t nblk = (inner + BLOCK - 1) / BLOCK, units = outer * nblk;
    int64_t u = units * part / nparts, end = units * (part + 1) / nparts;
    int64_t o = u / nblk, jb = u % nblk;
    int64_t idx[TNT_EW_MAXDIM];
    const float *src[TNT_EW_CONST];
    unravel(idx, o, shape, nd - 1);
    for (; u < end; o++, jb = 0) {
        int64_t off[TNT_EW_CONST];
        uint64_t filled = 0;  /* operands broadcast along the row, gathered once for it */
        for (int b = 0; b < nb; b++)
            off[b] = tnt_offset_of(offsets[b], idx, str[b], nd - 1);
        for (; jb < nblk && u < end; jb++, u++) {
            int64_t j0 = jb * BLOCK;
            int n = (int)(inner - j0 < BLOCK ? inner - j0 : BLOCK);
            for (int b = 1; b < nb; b++) {
                int64_t s = str[b][nd - 1];
                const char *p = elem(bufs[b], types[b], off[b] + j0 * s);
                if (types[b] == TNT_EW_OUT) {  /* laid out as the output: written in place */
                    src[b] = (const float *)bufs[b] + off[b] + j0;
                } else if (s == 1 && types[b] == TNT_EW_F32) {
                    src[b] = (const float *)p;
                } else if (s == 0) {  /* one value along the row (a per-channel statistic) */
                    if (!(filled & (1ull << b))) {
                        copy_row(gathered[b], p, types[b], BLOCK, 0);
                        filled |= 1ull << b;
                    }
                    src[b] = gathered[b];
                } else {
                    copy_row(gathered[b], p, types[b], n, s);
                    src[b] = gathered[b];
                }
            }
            float *out = (float *)bufs[0] + off[0] + j0;
            src[0] = out;
            run_steps(steps, ns, n, out, src, cval, into);
        }
        tnt_next_index(idx, shape, nd - 1);
    }
}
