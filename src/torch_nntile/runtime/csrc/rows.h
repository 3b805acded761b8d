/* Row-wise float32 tile kernels run in C on the StarPU workers: softmax and
   log-softmax with their backward, layer norm with its backward; sums, lookups,
   losses; optimizer updates, RMS norm and rotary embedding (nn.c); and kernels over
   tiles of any dtype (typed.c): strided copies (views, broadcasts, re-tilings,
   concatenations, padding, flips), typed elementwise maps, any / all, indexing. A
   tile is read as [outer, n, inner] with the reduced extent n in the middle (inner =
   1 when the reduced dims are the trailing ones). Parameters (int32) after the kind:

     TNT_ROWS_SOFTMAX          outer, n, inner, log          buffers: o, x
     TNT_ROWS_SOFTMAX_BACKWARD outer, n, inner, log          buffers: o, g, y
     TNT_ROWS_LAYER_NORM       rows, n, has_w, has_b          buffers: y, mean, rstd, x, [w], [b]; eps
     TNT_ROWS_LAYER_NORM_GRAD  rows, n, which, has_w, has_b, accumulate
                               buffers: o, g, x, mean, rstd, [w], [b]  (which: 0 input, 1 weight, 2 bias)
     TNT_ROWS_COPY_BOXES       esize, ndim, nbox, fill, fill_lo, fill_hi, dshape[ndim], then per box:
                               src, snumel, soff, dlo[ndim], extent[ndim], sstride[ndim]
                               buffers: dst, src...  (elements of esize bytes: 1, 2, 4 or 8. With
                               fill 1, all of dst is first set to the element whose bytes are
                               fill_lo, fill_hi (its low and high 32 bits); then each box of dst,
                               extent from dlo on, is read from buffer src (of snumel elements) at
                               soff + sum of i_d sstride_d: a view, a broadcast (stride 0), a
                               reversal (negative strides))
     TNT_ROWS_SUM              outer, n, inner, accumulate   buffers: o, x  (o[outer, inner])
     TNT_ROWS_GATHER           k, d, nw, index64             buffers: o[k, d], w[nw, d], index[k]
     TNT_ROWS_EMBEDDING_GRAD   k, d, nw, padding_idx, index64, accumulate
                               buffers: o[nw, d], g[k, d], index[k]  (rows add into o)
     TNT_ROWS_NLL              k, c, lo, classes (0: no check), ignore_index, per_row
                               buffers: o ([k] or a scalar: the sum), x[k, c], target[k] (int64)
     TNT_ROWS_NLL_WEIGHT       k, ignore_index               buffers: o (scalar), target[k] (int64)
     TNT_ROWS_NLL_GRAD         k, c, lo, ignore_index, mean, per_row
                               buffers: o[k, c], g ([k] or scalar), target[k] (int64), total weight
     TNT_ROWS_ARANGE           n, int64 output, lo           buffers: o; start, step (items lo on)
     TNT_ROWS_SGD              n, momentum, reads_buf, nesterov, maximize, weight_decay
                               buffers: p_out, [buf_out], p, g, [buf]; -lr, momentum, 1 - dampening,
                               weight_decay  (flags 0/1; buf_out with momentum, buf when reads_buf)
     TNT_ROWS_ADAMW            n, amsgrad, maximize, weight_decay, from_step
                               buffers: p_out, m_out, v_out, [vmax_out], p, g, m, v, [vmax], [step];
                               1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2,
                               sqrt(bias correction 2), eps, -step_size (from_step: beta1
                               and lr in place of the bias correction and step size)
     TNT_ROWS_RMS_NORM         rows, n, has_w                buffers: y, rstd, x, [w]; eps
     TNT_ROWS_RMS_NORM_GRAD    rows, n, which, has_w, accumulate
                               buffers: o, g, x, rstd, [w]  (which: 0 input, 1 weight)
     TNT_ROWS_ROPE             b, s, d, h, per_batch, transpose
                               buffers: y, x [b, s, d, h], cos, sin ([s, d], or [b, s, d] per batch)
     TNT_ROWS_MAP              op, ctype, otype, ndim, shape[ndim], then per operand of op:
                               type, buf, lo, hi, strides[ndim]
                               buffers: o (contiguous, of otype), then the operands' tiles (buf 1 on;
                               buf 0, of otype: o's current value, in a read-write task (an
                               accumulator); buf -1: an immediate, lo and hi the 32-bit halves of an int64 for an
                               operand read as integers, of a double's bits else). Operands (of
                               their type, read by strides in elements) are converted to ctype
                               (TNT_T_I64 for every integer and bool type, TNT_T_F32, TNT_T_F64;
                               where's condition is read as integers), op applied, the result
                               stored as otype (bool for comparisons; integers wrap)
     TNT_ROWS_ANY              outer, n, inner, all          buffers: o[outer, inner], x[outer, n, inner]
                               (bytes, bool or uint8: 1 where any / all of x's bytes are nonzero)
     TNT_ROWS_INDEX            outer, n, inner, k, esize, index64, dim
                               buffers: o[outer, k, inner], x[outer, n, inner], index[k]  (elements
                               of esize bytes; negative indices count from the end; one outside
                               [-n, n) fails the task: TNT_ROWS_BAD_SUBSCRIPT, with dim, the index
                               tile's position in the index list, and n)
     TNT_ROWS_INGRESS          as TNT_ROWS_COPY_BOXES, its one source (src 1) not a buffer but CPU
                               data the shim holds (tnt_blob_new; its address the one constant)
                               buffers: dst  (the task holds a reference to the data from its
                               submission until it has run: submit.c)

     TNT_ROWS_INDEX_N          esize, ndim, m, shape[ndim], xstride[ndim], then per index tile j < m:
                               flags, n, xstep, dim, istride[ndim]
                               buffers: o[shape] (contiguous), x, index 0 .. m-1  (x[i0, i1, ...],
                               and gather: element e of o, at position (c_0, ...), is read from x
                               at sum_d c_d xstride_d (the dims x keeps; 0 for the index dims)
                               plus, per index tile, xstep times its value at sum_d c_d istride_d
                               (broadcast: stride 0). Flags: 1, int64 indices (else int32); 2,
                               gather's: a value outside [0, n) fails the task with
                               TNT_ROWS_BAD_GATHER; else a negative value counts from n and one
                               outside [-n, n) fails it with TNT_ROWS_BAD_SUBSCRIPT; with dim and n)

     TNT_ROWS_ISUM             outer, n, inner, accumulate, type
                               buffers: o[outer, inner] (int64), x[outer, n, inner] (an integer or
                               bool type: the sums of PyTorch's integer sums, wrapping)

     TNT_ROWS_MAX_POOL2D       planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw
                               buffers: y[planes, oh, ow], indices (int64, alike), x[planes, h, w]
                               (as PyTorch's CPU kernel: a window's first in-range position to
                               start, a value taken where greater than the maximum so far or NaN)
     TNT_ROWS_MAX_POOL2D_GRAD  planes, h, w, oh, ow
                               buffers: gi[planes, h, w], g[planes, oh, ow], x (not read),
                               indices (int64, as g): gi zero but g added at each index in
                               order; -1 is skipped, one outside [0, h w) fails the task
                               (TNT_ROWS_BAD_INDEX)
     TNT_ROWS_BN_STATS         outer, c, inner              buffers: mean[c], m2[c], x[outer, c, inner]
                               (per channel: the mean and the sum of squared deviations from it)
     TNT_ROWS_BN_SUMS          outer, c, inner              buffers: sg[c], sgx[c], g, x (both
                               [outer, c, inner]), mean[c], invstd[c]  (sums of g and of
                               g (x - mean) invstd per channel)

     TNT_ROWS_BN_COMBINE       c, k, has_w, has_b, has_r, sizes[k]
                               buffers: mean, invstd, alpha, beta, [new running mean, var], [w], [b],
                               [running mean, var], k partial means, k partial m2 (all [c]); eps,
                               momentum  (the parts' statistics combined (Chan), the normalisation's
                               x * alpha + beta, the running statistics updated, the variance unbiased)
     TNT_ROWS_BN_GRAD_COMBINE  c, k, has_w, n             buffers: sg, sgx, c0, kk, a, invstd, [w],
                               k partial sg, k partial sgx (all [c])  (the sums over the parts, and
                               the input gradient's coefficients sg / n, sgx invstd / n, invstd w)
     TNT_ROWS_ATEN             nbuf; the one constant the address of a call of an ATen op prepared
                               by the backend's C++ library (backend/csrc/aten_calls.cpp), which
                               tnt_set_aten's function runs on the buffers (outputs first); one
                               that raises fails the task (TNT_ROWS_ATEN_FAILED)

   The kinds from TNT_ROWS_SGD to TNT_ROWS_ROPE and from TNT_ROWS_MAX_POOL2D on are in nn.c; TNT_ROWS_COPY_BOXES and
   those from TNT_ROWS_MAP to TNT_ROWS_ISUM (TNT_ROWS_INGRESS as a box copy) in typed.c.

   Tiles are float32 but for index and target tiles (int64, or int32 where index64 is
   0), the int64 output of TNT_ROWS_ARANGE, and the tiles of typed.c's kinds.

   Kinds and layouts are mirrored in kernels/native.py, the element types and map ops
   in kernels/typed.py. */
#ifndef TNT_ROWS_H
#define TNT_ROWS_H

#include <stdint.h>

enum { TNT_ROWS_SOFTMAX = 1, TNT_ROWS_SOFTMAX_BACKWARD, TNT_ROWS_LAYER_NORM, TNT_ROWS_LAYER_NORM_GRAD,
       TNT_ROWS_COPY_BOXES, TNT_ROWS_SUM, TNT_ROWS_GATHER, TNT_ROWS_EMBEDDING_GRAD, TNT_ROWS_NLL,
       TNT_ROWS_NLL_WEIGHT, TNT_ROWS_NLL_GRAD, TNT_ROWS_ARANGE, TNT_ROWS_SGD, TNT_ROWS_ADAMW, TNT_ROWS_RMS_NORM,
       TNT_ROWS_RMS_NORM_GRAD, TNT_ROWS_ROPE, TNT_ROWS_MAP, TNT_ROWS_ANY, TNT_ROWS_INDEX,
       TNT_ROWS_INGRESS, TNT_ROWS_INDEX_N, TNT_ROWS_ISUM, TNT_ROWS_MAX_POOL2D,
       TNT_ROWS_MAX_POOL2D_GRAD, TNT_ROWS_BN_STATS, TNT_ROWS_BN_SUMS, TNT_ROWS_ATEN,
       TNT_ROWS_BN_COMBINE, TNT_ROWS_BN_GRAD_COMBINE, TNT_ROWS_NKINDS };

/* Element types of TNT_ROWS_MAP operands and results. */
enum { TNT_T_BOOL = 0, TNT_T_U8, TNT_T_I8, TNT_T_I16, TNT_T_I32, TNT_T_I64, TNT_T_F32, TNT_T_F64, TNT_T_NTYPES };

/* TNT_ROWS_MAP's ops, with their operands: comparisons (a, b; the result bool),
   integer arithmetic (ctype TNT_T_I64, wrapping: a + c * b, a - c * b, a * b),
   where (cond, a, b: a where cond is nonzero, else b), the bitwise and, or, xor of
   integers and bools (a, b; ctype TNT_T_I64) and a conversion (a, read as ctype, stored
   as the result's type: ctype is the result's class, TNT_T_I64 for integers and bool). */
enum { TNT_MAP_EQ = 0, TNT_MAP_NE, TNT_MAP_LT, TNT_MAP_LE, TNT_MAP_GT, TNT_MAP_GE, TNT_MAP_ADD, TNT_MAP_SUB,
       TNT_MAP_MUL, TNT_MAP_WHERE, TNT_MAP_AND, TNT_MAP_OR, TNT_MAP_XOR, TNT_MAP_CAST, TNT_MAP_NOPS };

/* What a kernel found wrong in its input values (the task fails with the matching
   Python exception, named in runtime/submission.py): an index out of range (of a lookup,
   of an index tile), a target out of bounds. bad[0] is the offending value; for
   TNT_ROWS_BAD_SUBSCRIPT and TNT_ROWS_BAD_GATHER bad[1] and bad[2] are the dim and its size;
   TNT_ROWS_ATEN_FAILED: the ATen op raised (its error stays with the worker's thread);
   TNT_CUDA_CUBLAS_FAILED (cuda.c): a cuBLAS call returned status bad[0]. */
enum { TNT_ROWS_OK = 0, TNT_ROWS_BAD_INDEX, TNT_ROWS_BAD_TARGET, TNT_ROWS_BAD_SUBSCRIPT, TNT_ROWS_BAD_GATHER,
       TNT_ROWS_ATEN_FAILED, TNT_CUDA_CUBLAS_FAILED };

/* The function that runs TNT_ROWS_ATEN's prepared calls (0: none, and the kind is refused). */
typedef int (*tnt_aten_run_t)(const void *call, void *const *bufs, int nbuf);
extern tnt_aten_run_t tnt_aten_run;

/* 0 when ``p`` (``nints`` values after the kind) fits kind ``kind`` with ``nbuf`` buffers. */
int tnt_rows_check(int kind, const int32_t *p, int nints, int nconst, int nbuf);

/* TNT_ROWS_OK, or what was wrong (then bad[0..2] say which value). */
int tnt_rows_run(int kind, const int32_t *p, const double *consts, void *const *bufs, int64_t *bad);

#endif
