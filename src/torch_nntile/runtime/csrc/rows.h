/* Row-wise float32 tile kernels run in C on the StarPU workers: softmax and
   log-softmax with their backward, layer norm with its backward; and the box copies
   of re-tilings and concatenations; sums, lookups, losses; optimizer updates, RMS
   norm and rotary embedding (nn.c). A tile is read as
   [outer, n, inner] with the reduced extent n in the middle (inner = 1 when the
   reduced dims are the trailing ones). Parameters (int32) after the kind:

     TNT_ROWS_SOFTMAX          outer, n, inner, log          buffers: o, x
     TNT_ROWS_SOFTMAX_BACKWARD outer, n, inner, log          buffers: o, g, y
     TNT_ROWS_LAYER_NORM       rows, n, has_w, has_b          buffers: y, mean, rstd, x, [w], [b]; eps
     TNT_ROWS_LAYER_NORM_GRAD  rows, n, which, has_w, has_b, accumulate
                               buffers: o, g, x, mean, rstd, [w], [b]  (which: 0 input, 1 weight, 2 bias)
     TNT_ROWS_COPY_BOXES       ndim, nsrc, dshape[ndim], then per source:
                               sshape[ndim], dlo[ndim], slo[ndim], extent[ndim]
                               buffers: dst, src...  (each source's box into the destination)
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

   The kinds from TNT_ROWS_SGD on are in nn.c.

   Tiles are float32 but for index and target tiles (int64, or int32 where index64 is
   0) and the int64 output of TNT_ROWS_ARANGE.

   Kinds and layouts are mirrored in kernels/native.py. */
#ifndef TNT_ROWS_H
#define TNT_ROWS_H

#include <stdint.h>

enum { TNT_ROWS_SOFTMAX = 1, TNT_ROWS_SOFTMAX_BACKWARD, TNT_ROWS_LAYER_NORM, TNT_ROWS_LAYER_NORM_GRAD,
       TNT_ROWS_COPY_BOXES, TNT_ROWS_SUM, TNT_ROWS_GATHER, TNT_ROWS_EMBEDDING_GRAD, TNT_ROWS_NLL,
       TNT_ROWS_NLL_WEIGHT, TNT_ROWS_NLL_GRAD, TNT_ROWS_ARANGE, TNT_ROWS_SGD, TNT_ROWS_ADAMW, TNT_ROWS_RMS_NORM,
       TNT_ROWS_RMS_NORM_GRAD, TNT_ROWS_ROPE, TNT_ROWS_NKINDS };

/* What a kernel found wrong in its input values (the task fails with the matching
   Python exception, named in runtime/context.py): an index out of range, a target
   out of bounds. *bad is the offending value. */
enum { TNT_ROWS_OK = 0, TNT_ROWS_BAD_INDEX, TNT_ROWS_BAD_TARGET };

/* 0 when ``p`` (``nints`` values after the kind) fits kind ``kind`` with ``nbuf`` buffers. */
int tnt_rows_check(int kind, const int32_t *p, int nints, int nconst, int nbuf);

/* TNT_ROWS_OK, or what was wrong (then *bad says which value). */
int tnt_rows_run(int kind, const int32_t *p, const double *consts, void *const *bufs, int64_t *bad);

#endif
