/* Sharing work. While a host thread waits for a result (a readout: the loss of a
   training step) its core is free, and a chain of dependent tasks (a forward pass)
   keeps one worker busy while the other idles. A worker starting a large product
   or softmax then posts half of it here; an idle worker (its idle hook) takes it, as
   eager PyTorch would use a second thread. Whatever is not taken the poster runs
   itself, so nothing waits on a worker that is busy elsewhere. One slot. */
#include <starpu.h>
#include <sched.h>
#include <stdint.h>

#include "ew.h"
#include "rows.h"
#include "shim_internal.h"

/* Work a second worker may take (tnt_share): a part of a product (rows_kind 0), a
   part of an elementwise program (TNT_JOB_EW), or rows of a row-wise kernel (rows.h). */
#define TNT_JOB_EW (-1)
struct tnt_job {
    int rows_kind;
    struct tnt_gemm_part gemm;
    int32_t p[4];
    void *bufs[3];
    const int32_t *prog;  /* TNT_JOB_EW: the program, its constants, its buffers, the part (of 2) */
    const double *consts;
    void *const *ptrs;
    int part;
};

static void tnt_job_run(const struct tnt_job *j)
{
    if (j->rows_kind == 0) {
        tnt_gemm_run(&j->gemm);
    } else if (j->rows_kind == TNT_JOB_EW) {
        tnt_ew_run_part(j->prog, j->consts, j->ptrs, j->part, 2);
    } else {
        int64_t bad[3];
        tnt_rows_run(j->rows_kind, j->p, NULL, j->bufs, bad);
    }
}

enum { TNT_HELP_FREE, TNT_HELP_FILLING, TNT_HELP_POSTED, TNT_HELP_TAKEN, TNT_HELP_DONE };
static int tnt_help_state, tnt_host_waits;
static struct tnt_job tnt_help_job;

/* A host thread starts (+1) or stops (-1) waiting for the workers. */
void tnt_host_waiting(int change) { __atomic_add_fetch(&tnt_host_waits, change, __ATOMIC_RELAXED); }

static int tnt_may_share(void)
{
    return __atomic_load_n(&tnt_host_waits, __ATOMIC_RELAXED) > 0
           && __atomic_load_n(&tnt_help_state, __ATOMIC_RELAXED) == TNT_HELP_FREE;
}

/* In an idle worker: run a posted job, if there is one (1). */
int tnt_help(void)
{
    int posted = TNT_HELP_POSTED;
    if (__atomic_load_n(&tnt_help_state, __ATOMIC_RELAXED) != TNT_HELP_POSTED
        || !__atomic_compare_exchange_n(&tnt_help_state, &posted, TNT_HELP_TAKEN, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
        return 0;
    tnt_blas_single();
    tnt_job_run(&tnt_help_job);
    __atomic_store_n(&tnt_help_state, TNT_HELP_DONE, __ATOMIC_RELEASE);
    return 1;
}

/* Runs two independent jobs: ``rest`` on an idle worker where one takes it while a
   host thread waits, else both here. */
static void tnt_share(const struct tnt_job *mine, const struct tnt_job *rest)
{
    int free_ = TNT_HELP_FREE;
    if (!tnt_may_share()
        || !__atomic_compare_exchange_n(&tnt_help_state, &free_, TNT_HELP_FILLING, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
        tnt_job_run(mine);
        tnt_job_run(rest);
        return;
    }
    tnt_help_job = *rest;
    __atomic_store_n(&tnt_help_state, TNT_HELP_POSTED, __ATOMIC_RELEASE);
    tnt_job_run(mine);
    int posted = TNT_HELP_POSTED;
    if (__atomic_compare_exchange_n(&tnt_help_state, &posted, TNT_HELP_FILLING, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED)) {
        tnt_job_run(rest);  /* nobody took it */
    } else {
        while (__atomic_load_n(&tnt_help_state, __ATOMIC_ACQUIRE) != TNT_HELP_DONE)
            sched_yield();
    }
    __atomic_store_n(&tnt_help_state, TNT_HELP_FREE, __ATOMIC_RELEASE);
}

/* Runs ``p``: a large product in two parts, the second maybe on another worker
   (tnt_share). It is split the same way whoever runs the parts, so its values never
   depend on timing. */
void tnt_gemm_shared(struct tnt_gemm_part *p)
{
    struct tnt_job mine = {0}, rest = {0};
    if (!tnt_gemm_split(p, &rest.gemm)) {
        tnt_gemm_run(p);
        return;
    }
    mine.gemm = *p;
    tnt_share(&mine, &rest);
}

#define TNT_SHARE_MIN_ITEMS 32768  /* a softmax worth sharing: about 50 us of one core */

/* A softmax or its backward (rows.h) in two parts by outer rows where another worker
   may take one (1), else nothing done (0). Rows are independent: the same values
   either way. */
int tnt_softmax_shared(int kind, const int32_t *p, void *const *ptrs)
{
    int64_t outer = p[0], n = p[1], inner = p[2];
    if ((kind != TNT_ROWS_SOFTMAX && kind != TNT_ROWS_SOFTMAX_BACKWARD) || outer < 2
        || outer * n * inner < TNT_SHARE_MIN_ITEMS || !tnt_may_share())
        return 0;
    int nbuf = kind == TNT_ROWS_SOFTMAX ? 2 : 3, half = (int)(outer / 2);
    struct tnt_job mine = {0}, rest = {0};
    mine.rows_kind = rest.rows_kind = kind;
    for (int i = 0; i < 4; i++)
        mine.p[i] = rest.p[i] = p[i];
    mine.p[0] = half;
    rest.p[0] = (int32_t)(outer - half);
    for (int i = 0; i < nbuf; i++) {
        mine.bufs[i] = ptrs[i];
        rest.bufs[i] = (float *)ptrs[i] + (size_t)half * n * inner;
    }
    tnt_share(&mine, &rest);
    return 1;
}

/* Elementwise programs of at least this many element-steps (elements times steps)
   run in two parts (tnt_ew_shared): about 50-100 us of one core. */
static double tnt_split_ew_cost = 262144.0;
void tnt_set_split_ew_cost(double cost) { tnt_split_ew_cost = cost; }

/* Runs a large elementwise program in two parts, the second maybe on another worker
   (tnt_share), and returns 1; else runs nothing (0). Always split the same way, like
   products: whole blocks either way, so its values never depend on timing. ``ptrs``
   stays valid: tnt_share returns once both parts ran. */
int tnt_ew_shared(const int32_t *prog, const double *consts, void *const *ptrs)
{
    int64_t cost = tnt_ew_cost(prog);
    if (cost == 0 || (double)cost < tnt_split_ew_cost)
        return 0;
    struct tnt_job mine = {0}, rest = {0};
    mine.rows_kind = rest.rows_kind = TNT_JOB_EW;
    mine.prog = rest.prog = prog;
    mine.consts = rest.consts = consts;
    mine.ptrs = rest.ptrs = ptrs;
    rest.part = 1;
    tnt_share(&mine, &rest);
    return 1;
}
