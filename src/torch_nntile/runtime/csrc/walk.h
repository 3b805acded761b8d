/* Walking a tile's elements by strides: the dims of a loop over several buffers
   (buffer 0 written, the others read), merged where every buffer walks them as one,
   the index of each row, and the values of index tiles. Shared by the programs of ew.c and the copies and maps
   of typed.c. */
#ifndef TNT_WALK_H
#define TNT_WALK_H

#include <stdint.h>

#define TNT_WALK_MAXDIM 16

/* Merges neighbouring dims that every buffer walks as one (contiguous or broadcast
   in both); returns the new dim count. Size-1 dims go first. */
static inline int tnt_collapse(int nd, int nb, int64_t *shape, int64_t (*str)[TNT_WALK_MAXDIM])
{
    int out = 0;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 1 && nd > 1)
            continue;
        if (out > 0) {
            int ok = 1;
            for (int b = 0; b < nb && ok; b++)
                ok = str[b][out - 1] == str[b][d] * shape[d];
            if (ok) {
                shape[out - 1] *= shape[d];
                for (int b = 0; b < nb; b++)
                    str[b][out - 1] = str[b][d];
                continue;
            }
        }
        shape[out] = shape[d];
        for (int b = 0; b < nb; b++)
            str[b][out] = str[b][d];
        out++;
    }
    if (out == 0) {
        shape[0] = 1;
        for (int b = 0; b < nb; b++)
            str[b][0] = 0;
        out = 1;
    }
    return out;
}

/* Where a buffer's element at index idx (its first nd dims) lies. */
static inline int64_t tnt_offset_of(int64_t base, const int64_t *idx, const int64_t *stride, int nd)
{
    for (int d = 0; d < nd; d++)
        base += idx[d] * stride[d];
    return base;
}

/* The next index over dims 0..nd-1 of shape (the last fastest). */
static inline void tnt_next_index(int64_t *idx, const int64_t *shape, int nd)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < shape[d])
            break;
        idx[d] = 0;
    }
}

/* Element i of an index tile of int64 (index64) or int32 values. */
static inline int64_t tnt_index_at(const void *index, int index64, int64_t i)
{
    return index64 ? ((const int64_t *)index)[i] : ((const int32_t *)index)[i];
}

#endif
