/* The rows.h kinds of the nn layers and optimizers (nn.c): fused SGD and AdamW
   updates, RMS norm forward and backward, rotary embedding. Called by
   tnt_rows_run with a checked parameter list (rows.h lists the layouts). */
#ifndef TNT_NN_H
#define TNT_NN_H

#include <stdint.h>

void tnt_nn_sgd(const int32_t *p, const double *consts, void *const *bufs);
void tnt_nn_adamw(const int32_t *p, const double *consts, void *const *bufs);
void tnt_nn_rms_norm(const int32_t *p, const double *consts, void *const *bufs);
void tnt_nn_rms_norm_grad(const int32_t *p, void *const *bufs);
void tnt_nn_rope(const int32_t *p, void *const *bufs);

#endif
