/* The StarPU shim's interface: every StarPU struct stays in the shim's C files (shim.c
   and the files it lists); Python (cffi, API mode) sees the plain functions below.
   _build_shim.py hands the block between the "cdef" marks to cffi as they are, so
   this file is the one list of them. */
#ifndef TNT_SHIM_H
#define TNT_SHIM_H

#include <stddef.h>
#include <stdint.h>

/* Callbacks into Python, defined by the cffi module (_build_shim.py declares each
   line between the "callbacks" marks extern "Python+C": callable from the shim's C
   files). */
/* callbacks begin */
int64_t _tnt_kernel(int64_t key, uintptr_t *ptrs, int n, int worker, int64_t failed);
int64_t _tnt_input_error(int name, int code, int64_t value, int64_t dim, int64_t size);
/* callbacks end */

/* cdef begin */
typedef void *tnt_handle;
int tnt_init(int ncpu, int ncuda, const char *sched, int nice, int mpi);
int tnt_built_with_mpi(void);
int tnt_built_with_cuda(void);
int tnt_ncuda(void);
int tnt_worker_cuda_device(int worker);
uintptr_t tnt_cuda_stream(void);
int64_t tnt_cuda_take_ran_in_c(int64_t *keys, int64_t max);
int tnt_mpi_rank(void);
int tnt_mpi_size(void);
tnt_handle tnt_register_dist(size_t nelems, size_t elemsize, int owner);
void tnt_dist_stats(int64_t *out, int reset);
void tnt_set_owner(tnt_handle h, int owner);
int tnt_dist_exchange(const void *mine, int64_t nbytes, void *all, double timeout_s);
void tnt_mpi_abort(int code);
int64_t tnt_dist_tag(tnt_handle h);
int tnt_dist_owner(tnt_handle h);
void tnt_dist_fetch(tnt_handle h, int node);
void tnt_dist_set_alone(int on);
void tnt_dist_held(tnt_handle *hs, int64_t n, int64_t *out);
void tnt_dist_send(tnt_handle h, int dest, int64_t tag);
void tnt_dist_recv(tnt_handle h, int src, int64_t tag);
void tnt_dist_set_placed(int on);
void tnt_shutdown(void);
int tnt_ncpu(void);
int tnt_nworkers(void);
void tnt_pause(void);
void tnt_resume(void);
void tnt_trim(void);
void *tnt_blob_new(size_t nbytes);
void tnt_blob_release(void *data);
tnt_handle tnt_register(size_t nelems, size_t elemsize, int *allocated);
void tnt_set_managed(int64_t limit);
void tnt_invalidate_submit(tnt_handle h);
int tnt_add_disk(const char *path, int64_t nbytes);
void tnt_ooc_stats(double *out);
void tnt_disk_gone(void);
int64_t tnt_kernels_started(void);
void tnt_unregister_submit(tnt_handle h);
void tnt_unregister_now(tnt_handle h);
void tnt_set_no_memory(tnt_handle h, int64_t failure);
int tnt_submit_fail(tnt_handle h, int64_t failure);
void tnt_set_abandon(int64_t failure);
int tnt_wait_all(void);
void tnt_host_waiting(int change);
void tnt_set_split_macs(double macs);
void tnt_set_split_ew_cost(double cost);
void tnt_set_blas(uintptr_t sgemm, uintptr_t dgemm, uintptr_t set_threads_local, int skip);
void tnt_set_pack(uintptr_t pack_get_size, uintptr_t pack, uintptr_t compute);
size_t tnt_pack_size(int m, int n, int k);
int tnt_set_own_sgemm(int on);
void tnt_set_aten(uintptr_t run);
int tnt_submit_batch(int n, int64_t key0, int *nbufs, tnt_handle *handles, int *modes,
                     int ngemm, int *gemm, double *coef, int new, int32_t *ew, double *ewc,
                     int nhint, int32_t *hint, int trace, uint32_t where, int urgent_last, int *out,
                     uint8_t *here);
int64_t tnt_gemm_done(void);
void tnt_gemm_take_stats(int worker, int name, int64_t *calls, double *seconds);
int64_t tnt_gemm_event_count(void);
int64_t tnt_gemm_take_events(int64_t *keys, int *workers, int *names, double *t0, double *t1, int64_t max);
/* cdef end */

#endif
