/* The kinds of typed.h: kernels over tiles of any dtype. Copies move elements as
   unsigned integers of their size (bits, never values: NaN payloads and -0.0 stay);
   maps read each operand as its own type, convert it to the op's type (as PyTorch
   casts operands to their common dtype) and work in blocks of BLOCK values. */
#include "typed.h"
#include "rows.h"

#include <stddef.h>
#include <string.h>

#define BLOCK 256
#define TRANSPOSE_BLOCK 32  /* a side of the blocks a swap of the last two dims is copied in */

/* elements as bits of their size, whatever type the tile holds */
typedef uint8_t u8a __attribute__((may_alias));
typedef uint16_t u16a __attribute__((may_alias));
typedef uint32_t u32a __attribute__((may_alias));
typedef uint64_t u64a __attribute__((may_alias));

static int valid_esize(int esize) { return esize == 1 || esize == 2 || esize == 4 || esize == 8; }

/* n elements, ds and ss elements apart in d and s */
static inline void copy_run(int esize, char *d, int64_t ds, const char *s, int64_t ss, int64_t n)
{
    if (ds == 1 && ss == 1) {
        memcpy(d, s, (size_t)(n * esize));
        return;
    }
#define RUN(T) for (int64_t i = 0; i < n; i++) ((T *)d)[i * ds] = ((const T *)s)[i * ss]
    switch (esize) {
    case 1: RUN(u8a); break;
    case 2: RUN(u16a); break;
    case 4: RUN(u32a); break;
    default: RUN(u64a); break;
    }
#undef RUN
}

/* Row by row, straight from the source: memcpy where both rows are contiguous; where
   the last two dims are swapped (the source's stride 1 is along the second-last dim),
   in square blocks, whose source lines stay in cache while they are read across. */
void tnt_copy_strided(int esize, int nd, int64_t *shape, int64_t (*str)[TNT_WALK_MAXDIM], void *dst,
                      const void *src)
{
    int64_t total = 1;
    for (int d = 0; d < nd; d++)
        total *= shape[d];
    if (total == 0)
        return;
    nd = tnt_collapse(nd, 2, shape, str);
    char *o = dst;
    const char *x = src;
    int64_t inner = shape[nd - 1], di = str[0][nd - 1], si = str[1][nd - 1];
    int64_t idx[TNT_WALK_MAXDIM] = {0};
    if (si != 1 && di == 1 && nd >= 2 && str[1][nd - 2] == 1) {
        int64_t a = shape[nd - 2], da = str[0][nd - 2], planes = total / (a * inner);
        for (int64_t pl = 0; pl < planes; pl++) {
            char *op = o + esize * tnt_offset_of(0, idx, str[0], nd - 2);
            const char *xp = x + esize * tnt_offset_of(0, idx, str[1], nd - 2);
            for (int64_t i0 = 0; i0 < a; i0 += TRANSPOSE_BLOCK) {
                int64_t i1 = a - i0 < TRANSPOSE_BLOCK ? a : i0 + TRANSPOSE_BLOCK;
                for (int64_t j0 = 0; j0 < inner; j0 += TRANSPOSE_BLOCK) {
                    int64_t nj = inner - j0 < TRANSPOSE_BLOCK ? inner - j0 : TRANSPOSE_BLOCK;
                    for (int64_t i = i0; i < i1; i++)
                        copy_run(esize, op + esize * (i * da + j0), 1, xp + esize * (i + j0 * si), si, nj);
                }
            }
            tnt_next_index(idx, shape, nd - 2);
        }
        return;
    }
    for (int64_t r = total / inner; r > 0; r--) {
        copy_run(esize, o + esize * tnt_offset_of(0, idx, str[0], nd - 1), di,
                 x + esize * tnt_offset_of(0, idx, str[1], nd - 1), si, inner);
        tnt_next_index(idx, shape, nd - 1);
    }
}

/* -- TNT_ROWS_COPY_BOXES ---------------------------------------------------------- */

enum { BOX_HEAD = 6, BOX_FIXED = 3 };  /* ints before dshape; per box, before its per-dim values */

static int copy_boxes_check(const int32_t *p, int nints, int nbuf)
{
    if (nints < BOX_HEAD)
        return -1;
    int esize = p[0], nd = p[1], nbox = p[2];
    if (!valid_esize(esize) || nd < 1 || nd > TNT_WALK_MAXDIM || nbox < 0 || (p[3] != 0 && p[3] != 1) || nbuf < 1
        || nints != BOX_HEAD + nd + nbox * (BOX_FIXED + 3 * nd))
        return -1;
    const int32_t *dshape = p + BOX_HEAD;
    for (int d = 0; d < nd; d++)
        if (dshape[d] < 0)
            return -1;
    for (int b = 0; b < nbox; b++) {
        const int32_t *q = p + BOX_HEAD + nd + b * (BOX_FIXED + 3 * nd), *dlo = q + BOX_FIXED, *ext = dlo + nd,
                      *sstr = ext + nd;
        if (q[0] < 1 || q[0] >= nbuf || q[1] < 0 || q[2] < 0)
            return -1;
        int64_t lo = q[2], hi = q[2], n = 1;
        for (int d = 0; d < nd; d++) {
            if (ext[d] < 0 || dlo[d] < 0 || (int64_t)dlo[d] + ext[d] > dshape[d])
                return -1;
            n *= ext[d];
            int64_t span = ext[d] > 0 ? (int64_t)(ext[d] - 1) * sstr[d] : 0;
            if (span < 0)
                lo += span;
            else
                hi += span;
        }
        if (n > 0 && (lo < 0 || hi >= q[1]))  /* reads inside its source only */
            return -1;
    }
    return 0;
}

size_t tnt_copy_boxes_source_bytes(const int32_t *p, int src)
{
    int esize = p[0], nd = p[1], nbox = p[2];
    size_t most = 0;
    for (int b = 0; b < nbox; b++) {
        const int32_t *q = p + BOX_HEAD + nd + b * (BOX_FIXED + 3 * nd);
        if (q[0] == src && (size_t)q[1] * (size_t)esize > most)
            most = (size_t)q[1] * (size_t)esize;
    }
    return most;
}

/* n elements of dst set to the element whose bits are v */
static void fill_elements(int esize, void *dst, int64_t n, uint64_t v)
{
    switch (esize) {
    case 1: memset(dst, (int)(uint8_t)v, (size_t)n); break;
    case 2: for (int64_t i = 0; i < n; i++) ((u16a *)dst)[i] = (uint16_t)v; break;
    case 4: for (int64_t i = 0; i < n; i++) ((u32a *)dst)[i] = (uint32_t)v; break;
    default: for (int64_t i = 0; i < n; i++) ((u64a *)dst)[i] = v; break;
    }
}

static void copy_boxes(const int32_t *p, void *const *bufs)
{
    int esize = p[0], nd = p[1], nbox = p[2];
    const int32_t *dshape = p + BOX_HEAD;
    int64_t dstr[TNT_WALK_MAXDIM], total = 1;
    for (int d = nd - 1; d >= 0; d--) {
        dstr[d] = total;
        total *= dshape[d];
    }
    if (p[3])
        fill_elements(esize, bufs[0], total, (uint64_t)(uint32_t)p[4] | (uint64_t)(uint32_t)p[5] << 32);
    for (int b = 0; b < nbox; b++) {
        const int32_t *q = p + BOX_HEAD + nd + b * (BOX_FIXED + 3 * nd), *dlo = q + BOX_FIXED, *ext = dlo + nd,
                      *sstr = ext + nd;
        int64_t shape[TNT_WALK_MAXDIM], str[2][TNT_WALK_MAXDIM], doff = 0;
        for (int d = 0; d < nd; d++) {
            shape[d] = ext[d];
            str[0][d] = dstr[d];
            str[1][d] = sstr[d];
            doff += dlo[d] * dstr[d];
        }
        tnt_copy_strided(esize, nd, shape, str, (char *)bufs[0] + doff * esize,
                         (const char *)bufs[q[0]] + (int64_t)q[2] * esize);
    }
}

/* -- TNT_ROWS_MAP ------------------------------------------------------------------ */

enum { MAP_HEAD_INTS = 4, MAP_PER_OPERAND = 4 };  /* ints before shape; per operand, before its strides */

static int type_size(int type)
{
    static const int size[TNT_T_NTYPES] = { 1, 1, 1, 2, 4, 8, 4, 8 };
    return size[type];
}

static int is_integer(int type) { return type >= TNT_T_BOOL && type <= TNT_T_I64; }
static int map_nops(int op)
{
    return op == TNT_MAP_CAST ? 1 : op == TNT_MAP_ADD || op == TNT_MAP_SUB || op == TNT_MAP_WHERE ? 3 : 2;
}

/* the type operand k of op is read as: where's condition as integers, the others as ctype */
static int read_as(int op, int k, int ctype) { return op == TNT_MAP_WHERE && k == 0 ? TNT_T_I64 : ctype; }

static int map_check(const int32_t *p, int nints, int nbuf)
{
    if (nints < MAP_HEAD_INTS)
        return -1;
    int op = p[0], ctype = p[1], otype = p[2], nd = p[3];
    if (op < 0 || op >= TNT_MAP_NOPS || (ctype != TNT_T_I64 && ctype != TNT_T_F32 && ctype != TNT_T_F64)
        || otype < 0 || otype >= TNT_T_NTYPES || nd < 1 || nd > TNT_WALK_MAXDIM)
        return -1;
    int nops = map_nops(op);
    if (nints != MAP_HEAD_INTS + nd + nops * (MAP_PER_OPERAND + nd) || nbuf < 1 || nbuf > 1 + nops)
        return -1;
    for (int d = 0; d < nd; d++)
        if (p[MAP_HEAD_INTS + d] < 0)
            return -1;
    /* comparisons write bool; arithmetic is on integers; where and a conversion store
       their values' type, computed in its class */
    if (op <= TNT_MAP_GE ? otype != TNT_T_BOOL
        : op == TNT_MAP_WHERE || op == TNT_MAP_CAST ? (is_integer(otype) ? ctype != TNT_T_I64 : ctype != otype)
        : ctype != TNT_T_I64 || !is_integer(otype))
        return -1;
    for (int k = 0; k < nops; k++) {
        const int32_t *q = p + MAP_HEAD_INTS + nd + k * (MAP_PER_OPERAND + nd);
        if (q[1] == -1)
            continue;  /* an immediate */
        if (q[0] < 0 || q[0] >= TNT_T_NTYPES || q[1] < 0 || q[1] >= nbuf
            || (q[1] == 0 && q[0] != otype)  /* the output's current value: read as what it holds */
            || (read_as(op, k, ctype) == TNT_T_I64 && !is_integer(q[0])))  /* floats never become integers */
            return -1;
    }
    return 0;
}

union block { int64_t i[BLOCK]; float f[BLOCK]; double d[BLOCK]; };
static __thread union block operand[3], result;

/* n values of ``type``, ``stride`` elements apart from p, into v as ``as`` */
static void load(int as, int type, const char *p, int64_t stride, int n, union block *v)
{
#define LOAD_AS(T, dst, C) for (int i = 0; i < n; i++) dst[i] = (C)((const T *)p)[i * stride]
#define LOAD(T) if (as == TNT_T_I64) LOAD_AS(T, v->i, int64_t); \
                else if (as == TNT_T_F32) LOAD_AS(T, v->f, float); \
                else LOAD_AS(T, v->d, double)
    switch (type) {
    case TNT_T_BOOL: case TNT_T_U8: LOAD(uint8_t); break;
    case TNT_T_I8: LOAD(int8_t); break;
    case TNT_T_I16: LOAD(int16_t); break;
    case TNT_T_I32: LOAD(int32_t); break;
    case TNT_T_I64: LOAD(int64_t); break;
    case TNT_T_F32: LOAD(float); break;
    default: LOAD(double); break;
    }
#undef LOAD
#undef LOAD_AS
}

/* an immediate (its int64 or double bits) as BLOCK values read as ``as`` */
static void splat(int as, uint64_t bits, union block *v)
{
    double x;
    memcpy(&x, &bits, sizeof(x));
    for (int i = 0; i < BLOCK; i++) {
        if (as == TNT_T_I64)
            v->i[i] = (int64_t)bits;
        else if (as == TNT_T_F32)
            v->f[i] = (float)x;
        else
            v->d[i] = x;
    }
}

/* n results of ctype into the contiguous o of otype (integers wrap, bool is nonzero) */
static void store(int ctype, int otype, const union block *r, char *o, int n)
{
    if (ctype == TNT_T_F32) {
        memcpy(o, r->f, (size_t)n * sizeof(float));
    } else if (ctype == TNT_T_F64) {
        memcpy(o, r->d, (size_t)n * sizeof(double));
    } else if (otype == TNT_T_BOOL) {
        for (int i = 0; i < n; i++) ((uint8_t *)o)[i] = r->i[i] != 0;
    } else {
        switch (type_size(otype)) {
        case 1: for (int i = 0; i < n; i++) ((uint8_t *)o)[i] = (uint8_t)r->i[i]; break;
        case 2: for (int i = 0; i < n; i++) ((uint16_t *)o)[i] = (uint16_t)r->i[i]; break;
        case 4: for (int i = 0; i < n; i++) ((uint32_t *)o)[i] = (uint32_t)r->i[i]; break;
        default: memcpy(o, r->i, (size_t)n * sizeof(int64_t)); break;
        }
    }
}

/* op on n values of the operands' blocks v, into o (of otype) */
static void apply(int op, int ctype, int otype, int n, const union block *v, char *o)
{
    if (op <= TNT_MAP_GE) {
        uint8_t *b = (uint8_t *)o;
#define COMPARE(V) switch (op) { \
        case TNT_MAP_EQ: for (int i = 0; i < n; i++) b[i] = v[0].V[i] == v[1].V[i]; break; \
        case TNT_MAP_NE: for (int i = 0; i < n; i++) b[i] = v[0].V[i] != v[1].V[i]; break; \
        case TNT_MAP_LT: for (int i = 0; i < n; i++) b[i] = v[0].V[i] < v[1].V[i]; break; \
        case TNT_MAP_LE: for (int i = 0; i < n; i++) b[i] = v[0].V[i] <= v[1].V[i]; break; \
        case TNT_MAP_GT: for (int i = 0; i < n; i++) b[i] = v[0].V[i] > v[1].V[i]; break; \
        default: for (int i = 0; i < n; i++) b[i] = v[0].V[i] >= v[1].V[i]; break; }
        if (ctype == TNT_T_I64)
            COMPARE(i)
        else if (ctype == TNT_T_F32)
            COMPARE(f)
        else
            COMPARE(d)
#undef COMPARE
        return;
    }
    if (op == TNT_MAP_CAST) {  /* converted on loading */
        store(ctype, otype, &v[0], o, n);
        return;
    }
    union block *r = &result;
    const uint64_t *a = (const uint64_t *)v[0].i, *bb = (const uint64_t *)v[1].i, *c = (const uint64_t *)v[2].i;
    switch (op) {  /* integers in uint64: wrapping, as PyTorch's do */
    case TNT_MAP_ADD: for (int i = 0; i < n; i++) r->i[i] = (int64_t)(a[i] + c[i] * bb[i]); break;
    case TNT_MAP_SUB: for (int i = 0; i < n; i++) r->i[i] = (int64_t)(a[i] - c[i] * bb[i]); break;
    case TNT_MAP_MUL: for (int i = 0; i < n; i++) r->i[i] = (int64_t)(a[i] * bb[i]); break;
    case TNT_MAP_AND: for (int i = 0; i < n; i++) r->i[i] = (int64_t)(a[i] & bb[i]); break;
    case TNT_MAP_OR: for (int i = 0; i < n; i++) r->i[i] = (int64_t)(a[i] | bb[i]); break;
    case TNT_MAP_XOR: for (int i = 0; i < n; i++) r->i[i] = (int64_t)(a[i] ^ bb[i]); break;
    default:  /* TNT_MAP_WHERE */
        if (ctype == TNT_T_I64)
            for (int i = 0; i < n; i++) r->i[i] = v[0].i[i] ? v[1].i[i] : v[2].i[i];
        else if (ctype == TNT_T_F32)
            for (int i = 0; i < n; i++) r->f[i] = v[0].i[i] ? v[1].f[i] : v[2].f[i];
        else
            for (int i = 0; i < n; i++) r->d[i] = v[0].i[i] ? v[1].d[i] : v[2].d[i];
        break;
    }
    store(ctype, otype, r, o, n);
}

static void map_run(const int32_t *p, void *const *bufs)
{
    int op = p[0], ctype = p[1], otype = p[2], nd = p[3], nops = map_nops(op), per = MAP_PER_OPERAND + p[3];
    const int32_t *q = p + MAP_HEAD_INTS + nd;  /* the operands, per ints each */
    int64_t shape[TNT_WALK_MAXDIM], str[4][TNT_WALK_MAXDIM], total = 1;
    for (int d = nd - 1; d >= 0; d--) {  /* buffer 0, the output, is contiguous */
        shape[d] = p[MAP_HEAD_INTS + d];
        str[0][d] = total;
        total *= shape[d];
    }
    if (total == 0)
        return;
    for (int k = 0; k < nops; k++) {
        const int32_t *qk = q + k * per;
        for (int d = 0; d < nd; d++)
            str[1 + k][d] = qk[1] < 0 ? 0 : qk[MAP_PER_OPERAND + d];
        if (qk[1] < 0)
            splat(read_as(op, k, ctype), (uint64_t)(uint32_t)qk[2] | (uint64_t)(uint32_t)qk[3] << 32, &operand[k]);
    }
    nd = tnt_collapse(nd, 1 + nops, shape, str);
    int osize = type_size(otype);
    int64_t inner = shape[nd - 1], idx[TNT_WALK_MAXDIM] = {0};
    for (int64_t r = total / inner; r > 0; r--) {
        int64_t off[4];
        for (int b = 0; b <= nops; b++)
            off[b] = tnt_offset_of(0, idx, str[b], nd - 1);
        for (int64_t j0 = 0; j0 < inner; j0 += BLOCK) {
            int n = (int)(inner - j0 < BLOCK ? inner - j0 : BLOCK);
            for (int k = 0; k < nops; k++) {
                const int32_t *qk = q + k * per;
                if (qk[1] < 0)
                    continue;
                int64_t s = str[1 + k][nd - 1];
                load(read_as(op, k, ctype), qk[0], (const char *)bufs[qk[1]] + type_size(qk[0]) * (off[1 + k] + j0 * s),
                     s, n, &operand[k]);
            }
            apply(op, ctype, otype, n, operand, (char *)bufs[0] + osize * (off[0] + j0));
        }
        tnt_next_index(idx, shape, nd - 1);
    }
}

/* -- TNT_ROWS_ISUM ---------------------------------------------------------------- */

/* Integer and bool sums into int64 (PyTorch's dtype for them), added as unsigned:
   wrapping, as CPU's int64 sums do. */
static void isum(const int32_t *p, void *const *bufs)
{
    int64_t outer = p[0], n = p[1], inner = p[2];
    int accumulate = p[3], type = p[4], es = type_size(type);
    int64_t *o = bufs[0];
    const char *x = bufs[1];
    union block *v = &operand[0];
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            uint64_t s = accumulate ? (uint64_t)o[a * inner + c] : 0;
            for (int64_t j0 = 0; j0 < n; j0 += BLOCK) {
                int nb = (int)(n - j0 < BLOCK ? n - j0 : BLOCK);
                load(TNT_T_I64, type, x + ((a * n + j0) * inner + c) * es, inner, nb, v);
                for (int i = 0; i < nb; i++)
                    s += (uint64_t)v->i[i];
            }
            o[a * inner + c] = (int64_t)s;
        }
}

/* -- TNT_ROWS_ANY, TNT_ROWS_INDEX ----------------------------------------------------- */

static void any_all(const int32_t *p, void *const *bufs)
{
    int64_t outer = p[0], n = p[1], inner = p[2];
    uint8_t all = (uint8_t)p[3];
    uint8_t *o = bufs[0];
    const uint8_t *x = bufs[1];
    for (int64_t a = 0; a < outer; a++)
        for (int64_t c = 0; c < inner; c++) {
            const uint8_t *xr = x + a * n * inner + c;
            uint8_t v = all;
            for (int64_t j = 0; j < n; j++)
                if ((xr[j * inner] != 0) != all) {
                    v = !all;
                    break;
                }
            o[a * inner + c] = v;
        }
}

int tnt_take(int64_t outer, int64_t n, int64_t inner, int64_t k, int esize, int wrap, const void *index,
             int index64, void *o, const void *x, int64_t *bad)
{
    for (int64_t i = 0; i < k; i++) {
        int64_t r = tnt_index_at(index, index64, i);
        if (r < (wrap ? -n : 0) || r >= n) {
            *bad = r;
            return 1;
        }
    }
    size_t row = (size_t)(inner * esize);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t i = 0; i < k; i++) {
            int64_t r = tnt_index_at(index, index64, i);
            r += r < 0 ? n : 0;
            memcpy((char *)o + (a * k + i) * inner * esize, (const char *)x + (a * n + r) * inner * esize, row);
        }
    return 0;
}

/* x[..., index, ...] (one index tile). CPU reads no index where the result is empty. */
#define TNT_INDEX_MAXDIM 16

static int index_run(const int32_t *p, void *const *bufs, int64_t *bad)
{
    int64_t outer = p[0], n = p[1], inner = p[2], k = p[3];
    if (outer * inner == 0)
        return TNT_ROWS_OK;
    if (tnt_take(outer, n, inner, k, p[4], 1, bufs[2], p[5], bufs[0], bufs[1], bad)) {
        bad[1] = p[6];
        bad[2] = n;
        return TNT_ROWS_BAD_SUBSCRIPT;
    }
    return TNT_ROWS_OK;
}

/* x[i0, i1, ...] with several (broadcast) index tiles, or gather: element by element,
   as the results (a padding mask's lookup, position ids) are small. CPU reads no
   index where the result is empty. */
static int index_n_run(const int32_t *p, void *const *bufs, int64_t *bad)
{
    int esize = p[0], nd = p[1], m = p[2];
    const int32_t *shape = p + 3, *xstride = shape + nd, *ix = xstride + nd;
    int64_t total = 1, c[TNT_INDEX_MAXDIM] = {0};
    for (int d = 0; d < nd; d++)
        total *= shape[d];
    char *o = bufs[0];
    const char *x = bufs[1];
    for (int64_t e = 0; e < total; e++) {
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off += c[d] * xstride[d];
        for (int j = 0; j < m; j++) {
            const int32_t *q = ix + j * (4 + nd);
            int64_t n = q[1], at = 0;
            int gather = q[0] & 2;
            for (int d = 0; d < nd; d++)
                at += c[d] * q[4 + d];
            int64_t r = tnt_index_at(bufs[2 + j], q[0] & 1, at);
            if (r < (gather ? 0 : -n) || r >= n) {
                bad[0] = r;
                bad[1] = q[3];
                bad[2] = n;
                return gather ? TNT_ROWS_BAD_GATHER : TNT_ROWS_BAD_SUBSCRIPT;
            }
            off += (r < 0 ? r + n : r) * q[2];
        }
        memcpy(o + e * esize, x + off * esize, (size_t)esize);
        for (int d = nd - 1; d >= 0 && ++c[d] == shape[d]; d--)
            c[d] = 0;
    }
    return TNT_ROWS_OK;
}

static int index_n_check(const int32_t *p, int nints, int nbuf)
{
    if (nints < 3 || !valid_esize(p[0]) || p[1] < 1 || p[1] > TNT_INDEX_MAXDIM || p[2] < 1
        || nints != 3 + 2 * p[1] + p[2] * (4 + p[1]) || nbuf != 2 + p[2])
        return -1;
    int nd = p[1];
    for (int d = 0; d < nd; d++)
        if (p[3 + d] < 0 || p[3 + nd + d] < 0)
            return -1;
    for (int j = 0; j < p[2]; j++) {
        const int32_t *q = p + 3 + 2 * nd + j * (4 + nd);
        if (q[0] < 0 || q[0] > 3 || q[1] < 0 || q[2] < 0 || q[3] < 0)
            return -1;
        for (int d = 0; d < nd; d++)
            if (q[4 + d] < 0)
                return -1;
    }
    return 0;
}

int tnt_typed_check(int kind, const int32_t *p, int nints, int nbuf)
{
    switch (kind) {
    case TNT_ROWS_COPY_BOXES: return copy_boxes_check(p, nints, nbuf);
    case TNT_ROWS_MAP: return map_check(p, nints, nbuf);
    case TNT_ROWS_ANY:
        return nints == 4 && p[0] >= 0 && p[1] >= 0 && p[2] >= 0 && nbuf == 2 ? 0 : -1;
    case TNT_ROWS_INDEX_N: return index_n_check(p, nints, nbuf);
    case TNT_ROWS_ISUM:
        return nints == 5 && p[0] >= 0 && p[1] >= 0 && p[2] >= 0 && (p[3] == 0 || p[3] == 1) && p[4] >= 0
               && is_integer(p[4]) && nbuf == 2 ? 0 : -1;
    case TNT_ROWS_INDEX:
        return nints == 7 && p[0] >= 0 && p[1] >= 0 && p[2] >= 0 && p[3] >= 0 && valid_esize(p[4])
               && (p[5] == 0 || p[5] == 1) && p[6] >= 0 && nbuf == 3 ? 0 : -1;
    default: return -1;
    }
}

int tnt_typed_run(int kind, const int32_t *p, void *const *bufs, int64_t *bad)
{
    switch (kind) {
    case TNT_ROWS_COPY_BOXES: copy_boxes(p, bufs); break;
    case TNT_ROWS_MAP: map_run(p, bufs); break;
    case TNT_ROWS_ANY: any_all(p, bufs); break;
    case TNT_ROWS_INDEX: return index_run(p, bufs, bad);
    case TNT_ROWS_INDEX_N: return index_n_run(p, bufs, bad);
    case TNT_ROWS_ISUM: isum(p, bufs); break;
    default: break;
    }
    return TNT_ROWS_OK;
}
