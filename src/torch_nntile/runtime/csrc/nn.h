/* The rows.h kinds of the nn layers and optimizers (nn.c): fused SGD and AdamW
   updates, RMS norm forward and backward, rotary embedding; 2-d max pooling forward and
   backward, batch norm's per-tile sums (tnt_nn_check checks the records of these). Called by
   tnt_rows_run with a checked parameter list (rows.h lists the layouts). */
#ifndef TNT_NN_H
#define TNT_NN_H

#include <stdint.h>

void tnt_nn_sgd(const int32_t *p, const double *consts, void *const *bufs);
void tnt_nn_adamw(const int32_t *p, const double *consts, void *const *bufs);
void tnt_nn_rms_norm(const int32_t *p, const double *consts, void *const *bufs);
void tnt_nn_rms_norm_grad(const int32_t *p, void *const *bufs);
void tnt_nn_rope(const int32_t *p, void *const *bufs);
int tnt_nn_check(int kind, const int32_t *p, int nints, int nbuf);
void tnt_nn_max_pool2d(const int32_t *p, void *const *bufs);
int tnt_nn_max_pool2d_grad(const int32_t *p, void *const *bufs, int64_t *bad);
void tnt_nn_bn_stats(const int32_t *p, void *const *bufs);
void tnt_nn_bn_sums(const int32_t *p, void *const *bufs);
void tnt_nn_bn_combine(const int32_t *p, const double *consts, void *const *bufs);
void tnt_nn_bn_grad_combine(const int32_t *p, void *const *bufs);

#endif
