/* Elementwise tile programs run in C on the StarPU workers (no Python, no GIL).

   A program computes one float32 output tile from input tiles and double constants,
   one element at a time in blocks: each step reads up to four operands (input tiles,
   constants, or results of earlier steps) and the last step's result is the output.
   Input tiles are float32 or bool; a bool tile is read as 0.0 / 1.0, as PyTorch
   promotes it in float32 arithmetic (a dropout mask). Its layout (int32) is

       nbuf, ndim, shape[ndim], strides[nbuf][ndim], offsets[nbuf], types[nbuf], nsteps, steps[nsteps][5]

   where buffer 0 is the output (contiguous, float32), strides and offsets are in
   elements (a stride is 0 along a broadcast dim; views such as permutations are
   strides), types are TNT_EW_F32 or TNT_EW_BOOL for tiles read, TNT_EW_OUT for
   further tiles written (laid out as the output: a program with several results,
   each written by a TNT_EW_STORE step), and
   each step is (opcode, a, b, c, d) with operand references below TNT_EW_CONST
   naming buffers (0: the output's current value, for read-write tasks), below
   TNT_EW_TEMP constants, and from TNT_EW_TEMP on the results of earlier steps. The opcodes and operand order are
   mirrored in kernels/native.py. */
#ifndef TNT_EW_H
#define TNT_EW_H

#include <stdint.h>

#define TNT_EW_CONST 64
#define TNT_EW_TEMP 128
#define TNT_EW_MAXDIM 16
#define TNT_EW_MAXSTEPS 48

enum { TNT_EW_F32 = 0, TNT_EW_BOOL = 1, TNT_EW_OUT = 2 };  /* kinds of a program's buffers */

enum tnt_ew_op {
    TNT_EW_COPY = 0, TNT_EW_ADD, TNT_EW_SUB, TNT_EW_MUL, TNT_EW_DIV,
    TNT_EW_ADD_SCALED,   /* a + c * b (add with alpha) */
    TNT_EW_SUB_SCALED,   /* a - c * b (sub with alpha) */
    TNT_EW_ADDCMUL,      /* a + d * b * c */
    TNT_EW_ADDCDIV,      /* a + d * b / c */
    TNT_EW_LERP,         /* a + c * (b - a), as PyTorch splits it at |c| = 0.5 */
    TNT_EW_NEG, TNT_EW_ABS, TNT_EW_SQRT, TNT_EW_RSQRT, TNT_EW_RECIPROCAL,
    TNT_EW_EXP, TNT_EW_LOG, TNT_EW_TANH, TNT_EW_SIGMOID,
    TNT_EW_POW,          /* a ** b */
    TNT_EW_TANH_BACKWARD,     /* a * (1 - b * b) */
    TNT_EW_SIGMOID_BACKWARD,  /* a * (1 - b) * b */
    TNT_EW_THRESHOLD_BACKWARD,/* b <= c ? 0 : a */
    TNT_EW_CLAMP_MIN,    /* max(a, b), NaN of a kept */
    TNT_EW_CLAMP_MAX,    /* min(a, b), NaN of a kept */
    TNT_EW_MAXIMUM,      /* NaN of either kept */
    TNT_EW_MINIMUM,
    TNT_EW_GELU,         /* exact (erf); b its value at +inf, c at -0 */
    TNT_EW_GELU_TANH,
    TNT_EW_SILU,
    TNT_EW_WHERE,        /* a != 0 ? b : c (a: a bool tile) */
    TNT_EW_SIN, TNT_EW_COS,
    TNT_EW_GELU_BACKWARD,      /* a * GELU'(b), exact (erf) */
    TNT_EW_GELU_TANH_BACKWARD, /* a * GELU'(b), tanh approximation */
    TNT_EW_STORE,        /* a written to buffer b (a TNT_EW_OUT buffer); its own result unused */
    TNT_EW_NOPS
};

/* Checks a program against its task's buffer count: 0 when it can run. */
int tnt_ew_check(const int32_t *prog, int nints, int nconst, int nbuf);

/* Runs a checked program over the task's buffers. */
void tnt_ew_run(const int32_t *prog, const double *consts, void *const *bufs);

/* Runs part ``part`` of ``nparts`` of it: whole blocks as tnt_ew_run walks them, so the
   parts together write exactly what one run writes, whichever thread runs each. */
void tnt_ew_run_part(const int32_t *prog, const double *consts, void *const *bufs, int part, int nparts);

/* Element-steps of a checked program (its elements times its steps), the measure of
   whether it is worth splitting; 0 for one that runs whole (a strided copy). */
int64_t tnt_ew_cost(const int32_t *prog);

#endif
