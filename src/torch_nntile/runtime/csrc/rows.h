/* Row-wise float32 tile kernels run in C on the StarPU workers: softmax and
   log-softmax with their backward, layer norm with its backward; and the box copies
   of re-tilings and concatenations. A tile is read as
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

   Kinds and layouts are mirrored in kernels/native.py. */
#ifndef TNT_ROWS_H
#define TNT_ROWS_H

#include <stdint.h>

enum { TNT_ROWS_SOFTMAX = 1, TNT_ROWS_SOFTMAX_BACKWARD, TNT_ROWS_LAYER_NORM, TNT_ROWS_LAYER_NORM_GRAD,
       TNT_ROWS_COPY_BOXES };

/* 0 when ``p`` (``nints`` values after the kind) fits kind ``kind`` with ``nbuf`` buffers. */
int tnt_rows_check(int kind, const int32_t *p, int nints, int nconst, int nbuf);

void tnt_rows_run(int kind, const int32_t *p, const double *consts, void *const *bufs);

#endif
