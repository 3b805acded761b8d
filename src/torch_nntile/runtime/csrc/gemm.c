/* Packed single-precision products (gemm.h). A micro-kernel keeps a 12 x 32 block of
   C in 24 AVX-512 registers while it walks k: per k, two vectors of the packed B
   panel and twelve broadcast values of the packed A panel. A block of A (TNT_MC rows,
   TNT_SGEMM_KC of k) is packed per call into a per-thread buffer; B was packed once.
   On this machine's cores (AMD Zen 4) a 256 x 1024 x 1024 product so runs at about
   53-54 GMAC/s on one core against MKL's 50-51 (both measured warm, side by side). On
   an Intel Xeon with AMX (a lent GPU machine's host) the two were level, 77 against 78:
   MKL keeps its best kernels for Intel's CPUs, so these run on AMD's alone. */
#include "gemm.h"

#if !defined(__x86_64__)  /* elsewhere (arm64) never used: tnt_sgemm_ok is 0, products go to the BLAS */

int tnt_sgemm_ok(void) { return 0; }
size_t tnt_sgemm_packed_floats(int n, int k) { (void)n; (void)k; return 0; }
void tnt_sgemm_pack_b(int tb, int n, int k, float alpha, const float *b, int ldb, float *bp)
{ (void)tb; (void)n; (void)k; (void)alpha; (void)b; (void)ldb; (void)bp; }
void tnt_sgemm_packed(int ta, int m, int n, int k, const float *a, int lda, const float *bp, float beta, float *c,
                      int ldc)
{ (void)ta; (void)m; (void)n; (void)k; (void)a; (void)lda; (void)bp; (void)beta; (void)c; (void)ldc; }
int tnt_sgemm_own(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                  float beta, float *c, int ldc)
{
    (void)ta; (void)tb; (void)m; (void)n; (void)k; (void)alpha; (void)a; (void)lda; (void)b; (void)ldb; (void)beta;
    (void)c; (void)ldc;
    return 0;
}
#else

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NR TNT_SGEMM_NR
#define KC TNT_SGEMM_KC
#define MR 12
#define TNT_MC 192

#define AVX512 __attribute__((target("avx512f")))

int tnt_sgemm_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_is("amd");
}

static size_t npad(int n) { return (size_t)(n + NR - 1) / NR * NR; }

size_t tnt_sgemm_packed_floats(int n, int k) { return npad(n) * (size_t)(k > 0 ? k : 0); }

/* Transposes the 16 x 16 block in r[0..15] (rows in, columns out). */
static inline AVX512 void transpose16(__m512 *r)
{
    __m512 t[16], u[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int c = 0; c < 4; c++) {  /* u[4g + c]: column c of rows 4g..4g+3 in each 128-bit lane */
        __m512 a = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
        __m512 e = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88), f = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
        r[c] = _mm512_shuffle_f32x4(a, e, 0x88);
        r[c + 8] = _mm512_shuffle_f32x4(a, e, 0xDD);
        r[c + 4] = _mm512_shuffle_f32x4(b, f, 0x88);
        r[c + 12] = _mm512_shuffle_f32x4(b, f, 0xDD);
    }
}

/* One panel: rows k0..k0+kb of op(B), columns n0..n0+NR (0 past n), to bp. */
static AVX512 void pack_panel(int tb, int n, int n0, int k0, int kb, float alpha, const float *b, int ldb, float *bp)
{
    __m512 al = _mm512_set1_ps(alpha);
    if (!tb) {  /* rows of B are rows of the panel */
        for (int h = 0; h < 2; h++) {
            int j0 = n0 + 16 * h, cnt = n - j0 < 0 ? 0 : n - j0 > 16 ? 16 : n - j0;
            __mmask16 m = (__mmask16)((1u << cnt) - 1u);
            for (int kk = 0; kk < kb; kk++) {
                __m512 v = _mm512_maskz_loadu_ps(m, b + (size_t)(k0 + kk) * ldb + j0);
                _mm512_storeu_ps(bp + (size_t)kk * NR + 16 * h, alpha == 1.0f ? v : _mm512_mul_ps(v, al));
            }
        }
        return;
    }
    for (int h = 0; h < 2; h++) {  /* B stored n x k: 16 of its rows at a time, transposed in blocks */
        int j0 = n0 + 16 * h, cnt = n - j0 < 0 ? 0 : n - j0 > 16 ? 16 : n - j0;
        int kk = 0;
        if (cnt == 16) {
            for (; kk + 16 <= kb; kk += 16) {
                __m512 r[16];
                for (int i = 0; i < 16; i++)
                    r[i] = _mm512_loadu_ps(b + (size_t)(j0 + i) * ldb + k0 + kk);
                transpose16(r);
                for (int i = 0; i < 16; i++)
                    _mm512_storeu_ps(bp + (size_t)(kk + i) * NR + 16 * h, alpha == 1.0f ? r[i] : _mm512_mul_ps(r[i], al));
            }
        }
        for (; kk < kb; kk++)
            for (int i = 0; i < 16; i++)
                bp[(size_t)kk * NR + 16 * h + i] = i < cnt ? alpha * b[(size_t)(j0 + i) * ldb + k0 + kk] : 0.0f;
    }
}

void tnt_sgemm_pack_b(int tb, int n, int k, float alpha, const float *b, int ldb, float *bp)
{
    for (int k0 = 0; k0 < k; k0 += KC) {
        int kb = k - k0 < KC ? k - k0 : KC;
        for (int n0 = 0; n0 < n; n0 += NR, bp += (size_t)kb * NR)
            pack_panel(tb, n, n0, k0, kb, alpha, b, ldb, bp);
    }
}

/* Rows m0..m0+mb of op(A), its k0..k0+kb, as panels of MR rows (k-major, rows past mb 0). */
static void pack_a(int ta, const float *a, int lda, int m0, int mb, int k0, int kb, float *ap)
{
    for (int i0 = 0; i0 < mb; i0 += MR, ap += (size_t)kb * MR) {
        int rows = mb - i0 < MR ? mb - i0 : MR;
        if (ta) {  /* A stored k x m: a panel's rows lie side by side */
            for (int kk = 0; kk < kb; kk++) {
                const float *src = a + (size_t)(k0 + kk) * lda + m0 + i0;
                for (int r = 0; r < MR; r++)
                    ap[(size_t)kk * MR + r] = r < rows ? src[r] : 0.0f;
            }
        } else {
            for (int r = 0; r < MR; r++) {
                const float *src = a + (size_t)(m0 + i0 + r) * lda + k0;
                if (r < rows)
                    for (int kk = 0; kk < kb; kk++)
                        ap[(size_t)kk * MR + r] = src[kk];
                else
                    for (int kk = 0; kk < kb; kk++)
                        ap[(size_t)kk * MR + r] = 0.0f;
            }
        }
    }
}

/* C block (rows x cols of at most MR x NR) = scale * C + A panel @ B panel; scale 0:
   C only written. */
static AVX512 void kernel(int kb, const float *ap, const float *bp, float *c, int ldc, int rows, int cols,
                          float scale)
{
    __m512 acc[MR][2];
    for (int r = 0; r < rows; r++) {  /* C's lines arrive while k runs (k = 256, beta 1: 48 -> 51 GMAC/s) */
        _mm_prefetch((const char *)(c + (size_t)r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + (size_t)r * ldc + 16), _MM_HINT_T0);
    }
    for (int r = 0; r < MR; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int kk = 0; kk < kb; kk++) {
        __m512 b0 = _mm512_loadu_ps(bp + (size_t)kk * NR), b1 = _mm512_loadu_ps(bp + (size_t)kk * NR + 16);
        const float *a = ap + (size_t)kk * MR;
#define TNT_ROW(r)                                                   \
        {                                                            \
            __m512 av = _mm512_set1_ps(a[r]);                        \
            acc[r][0] = _mm512_fmadd_ps(av, b0, acc[r][0]);          \
            acc[r][1] = _mm512_fmadd_ps(av, b1, acc[r][1]);          \
        }
        TNT_ROW(0) TNT_ROW(1) TNT_ROW(2) TNT_ROW(3) TNT_ROW(4) TNT_ROW(5)
        TNT_ROW(6) TNT_ROW(7) TNT_ROW(8) TNT_ROW(9) TNT_ROW(10) TNT_ROW(11)
#undef TNT_ROW
    }
    __mmask16 m0 = (__mmask16)(cols >= 16 ? 0xFFFFu : (1u << cols) - 1u);
    __mmask16 m1 = (__mmask16)(cols >= 32 ? 0xFFFFu : cols <= 16 ? 0u : (1u << (cols - 16)) - 1u);
    __m512 s = _mm512_set1_ps(scale);
    for (int r = 0; r < rows; r++) {
        float *cr = c + (size_t)r * ldc;
        __m512 v0 = acc[r][0], v1 = acc[r][1];
        if (scale == 1.0f) {
            v0 = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, cr), v0);
            v1 = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, cr + 16), v1);
        } else if (scale != 0.0f) {
            v0 = _mm512_add_ps(_mm512_mul_ps(s, _mm512_maskz_loadu_ps(m0, cr)), v0);
            v1 = _mm512_add_ps(_mm512_mul_ps(s, _mm512_maskz_loadu_ps(m1, cr + 16)), v1);
        }
        _mm512_mask_storeu_ps(cr, m0, v0);
        _mm512_mask_storeu_ps(cr + 16, m1, v1);
    }
}

/* Per-thread buffers made at first use (NULL where no memory was found): the packed A
   (TNT_MC x KC floats) and, for products whose B is packed per call, the packed B of
   one k block (at most TNT_B_FLOATS). */
#define TNT_B_FLOATS ((size_t)1 << 20)

static float *a_buffer(void)
{
    static __thread float *buf;
    if (buf == NULL)
        buf = aligned_alloc(64, (size_t)TNT_MC * KC * sizeof(float));
    return buf;
}

static float *b_buffer(void)
{
    static __thread float *buf;
    if (buf == NULL)
        buf = aligned_alloc(64, TNT_B_FLOATS * sizeof(float));
    return buf;
}

/* C = scale * C + op(A)[:, k0:k0+kb] @ (the block's packed panels); scale 0: C only written. */
static void run_block(int ta, int m, int n, int k0, int kb, const float *a, int lda, const float *panels, float scale,
                      float *c, int ldc, float *ap, int mc)
{
    for (int m0 = 0; m0 < m; m0 += mc) {
        int mb = m - m0 < mc ? m - m0 : mc;
        pack_a(ta, a, lda, m0, mb, k0, kb, ap);
        const float *panel = panels;
        for (int n0 = 0; n0 < n; n0 += NR, panel += (size_t)kb * NR)
            for (int i0 = 0; i0 < mb; i0 += MR)
                kernel(kb, ap + (size_t)(i0 / MR) * kb * MR, panel, c + (size_t)(m0 + i0) * ldc + n0, ldc,
                       mb - i0 < MR ? mb - i0 : MR, n - n0 < NR ? n - n0 : NR, scale);
    }
}

void tnt_sgemm_packed(int ta, int m, int n, int k, const float *a, int lda, const float *bp, float beta, float *c,
                      int ldc)
{
    if (m <= 0 || n <= 0)
        return;
    if (k <= 0) {  /* an empty sum: beta * C, or 0 */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++)
                c[(size_t)i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[(size_t)i * ldc + j];
        return;
    }
    float small[MR * KC] __attribute__((aligned(64)));
    float *ap = a_buffer();
    int mc = ap != NULL ? TNT_MC : MR;
    if (ap == NULL)
        ap = small;
    size_t np = npad(n);
    for (int k0 = 0; k0 < k; k0 += KC) {
        int kb = k - k0 < KC ? k - k0 : KC;
        run_block(ta, m, n, k0, kb, a, lda, bp + (size_t)k0 * np, k0 == 0 ? beta : 1.0f, c, ldc, ap, mc);
    }
}

int tnt_sgemm_own(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
                  float beta, float *c, int ldc)
{
    if (m <= 0 || n <= 0 || k <= 0 || npad(n) * (size_t)(k < KC ? k : KC) > TNT_B_FLOATS)
        return 0;
    float *bp = b_buffer(), *ap = a_buffer();
    if (bp == NULL || ap == NULL)
        return 0;
    for (int k0 = 0; k0 < k; k0 += KC) {
        int kb = k - k0 < KC ? k - k0 : KC;
        float *panel = bp;
        for (int n0 = 0; n0 < n; n0 += NR, panel += (size_t)kb * NR)
            pack_panel(tb, n, n0, k0, kb, alpha, b, ldb, panel);
        run_block(ta, m, n, k0, kb, a, lda, bp, k0 == 0 ? beta : 1.0f, c, ldc, ap, TNT_MC);
    }
    return 1;
}

#endif  /* __x86_64__ */
