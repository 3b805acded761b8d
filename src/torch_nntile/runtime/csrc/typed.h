/* The rows.h kinds over tiles of any dtype (typed.c): strided copies of elements of
   1, 2, 4 or 8 bytes (views, broadcasts, boxes with a fill), typed elementwise maps
   (comparisons, integer arithmetic, where), any / all, and indexing by an index
   tile; and the strided copy that ew.c's copy programs and rows.c's lookups share.
   tnt_rows_check / tnt_rows_run call the kinds with the layouts rows.h lists. */
#ifndef TNT_TYPED_H
#define TNT_TYPED_H

#include <stddef.h>
#include <stdint.h>

#include "walk.h"

/* dst[i] = src[i] for every index i of shape, walked by the element strides str[0]
   (dst) and str[1] (src); elements of esize bytes (1, 2, 4 or 8). Changes shape and str. */
void tnt_copy_strided(int esize, int nd, int64_t *shape, int64_t (*str)[TNT_WALK_MAXDIM], void *dst,
                      const void *src);

/* o[a, i, c] = x[a, index[i], c] for o[outer, k, inner] and x[outer, n, inner] (elements
   of esize bytes; with wrap, negative indices count from the end). 1 and nothing
   copied where an index is out of range (the first in index order is put in *bad), else 0. */
int tnt_take(int64_t outer, int64_t n, int64_t inner, int64_t k, int esize, int wrap, const void *index,
             int index64, void *o, const void *x, int64_t *bad);

/* The bytes a checked TNT_ROWS_COPY_BOXES record ``p`` reads from buffer ``src`` at most
   (its boxes' source sizes): what that buffer must hold. */
size_t tnt_copy_boxes_source_bytes(const int32_t *p, int src);

/* 0 when p (nints values after the kind) fits typed kind ``kind`` with nbuf buffers. */
int tnt_typed_check(int kind, const int32_t *p, int nints, int nbuf);

/* Runs a checked typed kind: TNT_ROWS_OK, or what was wrong (bad[0..2], as rows.h says). */
int tnt_typed_run(int kind, const int32_t *p, void *const *bufs, int64_t *bad);

#endif
