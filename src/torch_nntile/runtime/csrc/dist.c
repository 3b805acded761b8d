/* Tiles distributed over the processes of an MPI world (StarPU-MPI): every process
   submits the same tasks in the same order; each tile has an owner rank and an MPI tag;
   a task runs on one rank, which receives the tiles it reads from their owners, and the
   other ranks skip it (they still take part: an owner sends what the task reads).

   Owners are data that every rank derives alike, without talking:
   - a tile of a value distributed by its tiling gets its owner when it is registered
     (tnt_register_dist, from the axis-group rule in tiling/distribution.py);
   - any other tile gets its owner from the first task that writes it: that task runs
     where the tiles it already writes live, else where the first tile it reads lives
     (owner computes, the data stays put), else on the next rank in turn (a value made
     from nothing: a fill, a copy of CPU data).
   Tags come from a counter advanced at each registration, in submission order: the same
   on every rank. A task that writes nothing (a readout) runs on every rank, each
   receiving the tiles it lacks.

   StarPU-MPI's cache of received copies spares a second transfer of a tile no task has
   written since; a write clears it on every rank. Bytes sent and received and the tasks
   run here and elsewhere are counted (tnt_dist_stats). */
#include <starpu.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "shim_internal.h"

#ifdef TNT_MPI
#include <starpu_mpi.h>

int tnt_dist_on;  /* several ranks: tasks are placed (tnt_dist_place) */
static int tnt_me, tnt_size;
static int64_t tnt_next_tag = 1;  /* advanced by every registration, in the same order on every rank */
static int64_t tnt_turn;  /* placements of values made from nothing, in turn over the ranks */
static int64_t tnt_sent_bytes, tnt_recv_bytes, tnt_tasks_here, tnt_tasks_elsewhere;
static int64_t tnt_agree_calls;  /* tnt_dist_exchange calls: their tags */
static int tnt_dist_alone;  /* tnt_dist_set_alone */

void tnt_dist_start(int me, int size)
{
    tnt_me = me;
    tnt_size = size;
    tnt_dist_on = size > 1;
    tnt_next_tag = 1;
    tnt_turn = 0;
    tnt_agree_calls = 0;
    tnt_sent_bytes = tnt_recv_bytes = tnt_tasks_here = tnt_tasks_elsewhere = 0;
}

/* A tile of nelems items, owned by rank ``owner`` (-1: by the rank of the first task
   that writes it). StarPU allocates its memory on the ranks that need it: the owner at
   the first write, another rank when it receives a copy. A read before any write (a
   zero-size value's tile) gets zeros (tnt_init_cl), as out of core. */
tnt_handle tnt_register_dist(size_t nelems, size_t elemsize, int owner)
{
    starpu_data_handle_t h;
    if (nelems <= UINT32_MAX)
        starpu_vector_data_register(&h, -1, 0, (uint32_t)nelems, elemsize);
    else
        starpu_vector_data_register(&h, -1, 0, 1, nelems * elemsize);
    starpu_data_set_reduction_methods(h, NULL, &tnt_init_cl);
    starpu_mpi_data_register(h, tnt_next_tag++, owner >= 0 && owner < tnt_size ? owner : -1);
    return (tnt_handle)h;
}

/* Give a tile no task has written yet (registered with owner -1) an owner: the lowering
   of a sum over tiles of several ranks chooses where the sum lives. */
void tnt_set_owner(tnt_handle h, int owner)
{
    if (owner >= 0 && owner < tnt_size)
        starpu_mpi_data_set_rank((starpu_data_handle_t)h, owner);
}

static void tnt_recv(starpu_data_handle_t d, int from, int prio)
{
    if (starpu_mpi_cached_receive_set(d))
        return;  /* the copy received earlier is still the value */
    __atomic_add_fetch(&tnt_recv_bytes, (int64_t)starpu_data_get_size(d), __ATOMIC_RELAXED);
    starpu_mpi_irecv_detached_prio(d, from, starpu_mpi_data_get_tag(d), prio, MPI_COMM_WORLD, NULL, NULL);
}

static void tnt_isend(starpu_data_handle_t d, int to, int prio)
{
    if (starpu_mpi_cached_send_set(d, to))
        return;  /* sent before, and not written since */
    __atomic_add_fetch(&tnt_sent_bytes, (int64_t)starpu_data_get_size(d), __ATOMIC_RELAXED);
    starpu_mpi_isend_detached_prio(d, to, starpu_mpi_data_get_tag(d), prio, MPI_COMM_WORLD, NULL, NULL);
}

/* Where a task on these handles runs (a rank, or TNT_DIST_ALL), with the transfers it
   needs posted: call before submitting it (StarPU orders a tile's receive before the
   task that reads it), and tnt_dist_after once it is submitted or skipped. */
int tnt_dist_place(int n, tnt_handle *handles, int *modes, int prio)
{
    if (tnt_dist_alone) {  /* its tiles are here already (tnt_dist_fetch) */
        __atomic_add_fetch(&tnt_tasks_here, 1, __ATOMIC_RELAXED);
        return TNT_DIST_ALL;
    }
    int x = -1, writes = 0;
    for (int i = 0; i < n; i++) {
        if (!(modes[i] & STARPU_W))
            continue;
        writes = 1;
        int o = starpu_mpi_data_get_rank((starpu_data_handle_t)handles[i]);
        if (o >= 0) {
            x = o;
            break;
        }
    }
    if (!writes) {  /* a readout: every rank runs it, on tiles every rank gets */
        for (int i = 0; i < n; i++) {
            starpu_data_handle_t d = (starpu_data_handle_t)handles[i];
            int o = starpu_mpi_data_get_rank(d);
            if (o < 0)
                continue;  /* never written: zeros everywhere */
            if (o == tnt_me) {
                for (int r = 0; r < tnt_size; r++)
                    if (r != tnt_me)
                        tnt_isend(d, r, prio);
            } else {
                tnt_recv(d, o, prio);
            }
        }
        __atomic_add_fetch(&tnt_tasks_here, 1, __ATOMIC_RELAXED);
        return TNT_DIST_ALL;
    }
    for (int i = 0; x < 0 && i < n; i++) {
        int o = starpu_mpi_data_get_rank((starpu_data_handle_t)handles[i]);
        if (!(modes[i] & STARPU_W) && o >= 0)
            x = o;
    }
    if (x < 0)
        x = (int)(tnt_turn++ % tnt_size);
    for (int i = 0; i < n; i++) {  /* tiles written here first are owned here */
        starpu_data_handle_t d = (starpu_data_handle_t)handles[i];
        if (starpu_mpi_data_get_rank(d) < 0)
            starpu_mpi_data_set_rank(d, x);
    }
    for (int i = 0; i < n; i++) {
        if (!(modes[i] & STARPU_R))
            continue;
        starpu_data_handle_t d = (starpu_data_handle_t)handles[i];
        int o = starpu_mpi_data_get_rank(d);
        if (o == x)
            continue;
        if (x == tnt_me)
            tnt_recv(d, o, prio);
        else if (o == tnt_me)
            tnt_isend(d, x, prio);
    }
    __atomic_add_fetch(x == tnt_me ? &tnt_tasks_here : &tnt_tasks_elsewhere, 1, __ATOMIC_RELAXED);
    return x;
}

/* After a task placed on rank x: a tile it wrote that another rank owns (a task writing
   tiles of two owners) goes back to its owner; every copy of what it wrote that was
   sent or received before is stale, on every rank. */
void tnt_dist_after(int n, tnt_handle *handles, int *modes, int x, int prio)
{
    if (x == TNT_DIST_ALL)
        return;
    for (int i = 0; i < n; i++) {
        if (!(modes[i] & STARPU_W))
            continue;
        starpu_data_handle_t d = (starpu_data_handle_t)handles[i];
        int o = starpu_mpi_data_get_rank(d);
        if (o != x) {
            if (x == tnt_me)
                starpu_mpi_isend_detached_prio(d, o, starpu_mpi_data_get_tag(d), prio, MPI_COMM_WORLD, NULL, NULL);
            else if (o == tnt_me)
                starpu_mpi_irecv_detached_prio(d, x, starpu_mpi_data_get_tag(d), prio, MPI_COMM_WORLD, NULL, NULL);
        }
        starpu_mpi_cached_send_clear(d);
        starpu_mpi_cached_receive_clear(d);
    }
}

/* The ranks agree (runtime/agree.py): every rank sends ``nbytes`` of its own to every
   other rank and receives theirs into ``all`` (rank r's at r * nbytes; its own copied),
   calls in the same order on every rank. 0 once all arrived, 1 when they did not
   within ``timeout_s`` seconds (a rank that stopped, or waits elsewhere). Tags above
   the tiles' (TNT_AGREE_TAG + a count of calls). */
#define TNT_AGREE_TAG ((int64_t)1 << 60)

int tnt_dist_exchange(const void *mine, int64_t nbytes, void *all, double timeout_s)
{
    int n = tnt_size, me = tnt_me, rc = 0;
    int64_t tag = TNT_AGREE_TAG + tnt_agree_calls++;
    memcpy((char *)all + (size_t)me * nbytes, mine, (size_t)nbytes);
    if (n < 2)
        return 0;
    starpu_data_handle_t out, in[n];
    starpu_mpi_req sreq[n], rreq[n];
    int done[2 * n];
    starpu_vector_data_register(&out, STARPU_MAIN_RAM, (uintptr_t)mine, (uint32_t)nbytes, 1);
    for (int r = 0; r < n; r++) {
        done[r] = done[n + r] = r == me;
        if (r == me)
            continue;
        starpu_vector_data_register(&in[r], STARPU_MAIN_RAM, (uintptr_t)((char *)all + (size_t)r * nbytes),
                                    (uint32_t)nbytes, 1);
        starpu_mpi_irecv(in[r], &rreq[r], r, tag, MPI_COMM_WORLD);
        starpu_mpi_isend(out, &sreq[r], r, tag, MPI_COMM_WORLD);
    }
    double end = starpu_timing_now() + timeout_s * 1e6;
    for (int left = 2 * (n - 1); left > 0;) {
        for (int k = 0; k < 2 * n; k++) {
            if (done[k])
                continue;
            int flag = 0;
            starpu_mpi_test(k < n ? &rreq[k] : &sreq[k - n], &flag, MPI_STATUS_IGNORE);
            if (flag) {
                done[k] = 1;
                left--;
            }
        }
        if (left == 0)
            break;
        if (starpu_timing_now() > end) {
            rc = 1;  /* the requests stay posted: the caller stops every rank */
            break;
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
    if (rc == 0) {
        for (int r = 0; r < n; r++)
            if (r != me)
                starpu_data_unregister(in[r]);
        starpu_data_unregister(out);
    }
    return rc;
}

/* Stop every rank of the world now (mpirun reports which one called it). */
void tnt_mpi_abort(int code)
{
    MPI_Abort(MPI_COMM_WORLD, code);
}

/* The tag of a tile, and its owner (-1: not written yet). */
int64_t tnt_dist_tag(tnt_handle h) { return starpu_mpi_data_get_tag((starpu_data_handle_t)h); }
int tnt_dist_owner(tnt_handle h) { return starpu_mpi_data_get_rank((starpu_data_handle_t)h); }

/* A read by one rank alone (runtime/agree.py): rank ``node`` gets the tile, its owner
   sending it (both call this, alike), unless it was sent before and not written since. */
void tnt_dist_fetch(tnt_handle h, int node)
{
    starpu_data_handle_t d = (starpu_data_handle_t)h;
    int o = starpu_mpi_data_get_rank(d);
    if (o < 0 || o == node)
        return;
    if (tnt_me == node && !starpu_mpi_cached_receive(d))
        __atomic_add_fetch(&tnt_recv_bytes, (int64_t)starpu_data_get_size(d), __ATOMIC_RELAXED);
    else if (tnt_me == o && !starpu_mpi_cached_send(d, node))
        __atomic_add_fetch(&tnt_sent_bytes, (int64_t)starpu_data_get_size(d), __ATOMIC_RELAXED);
    starpu_mpi_get_data_on_node_detached(MPI_COMM_WORLD, d, node, NULL, NULL);
}

/* torch.distributed's collectives (torch_nntile/distributed.py): a tile of this rank's
   own sent to rank ``dest``, or one received from ``src`` into a tile no task has written
   yet, under a tag both sides compute alike. StarPU orders the send after the tile's
   writers and the tile's readers after the receive. */
void tnt_dist_send(tnt_handle h, int dest, int64_t tag)
{
    starpu_data_handle_t d = (starpu_data_handle_t)h;
    __atomic_add_fetch(&tnt_sent_bytes, (int64_t)starpu_data_get_size(d), __ATOMIC_RELAXED);
    starpu_mpi_isend_detached(d, dest, tag, MPI_COMM_WORLD, NULL, NULL);
}

void tnt_dist_recv(tnt_handle h, int src, int64_t tag)
{
    starpu_data_handle_t d = (starpu_data_handle_t)h;
    __atomic_add_fetch(&tnt_recv_bytes, (int64_t)starpu_data_get_size(d), __ATOMIC_RELAXED);
    starpu_mpi_irecv_detached(d, src, tag, MPI_COMM_WORLD, NULL, NULL);
}

/* Tasks are placed over the ranks (the default over several), or each rank keeps its own
   values (torch.distributed's process group: every rank a replica). */
void tnt_dist_set_placed(int on) { tnt_dist_on = on && tnt_size > 1; }

/* Bytes of the tiles ``hs`` this rank owns (out[0]) and holds in its memory (out[1]:
   its own and the copies it received, as StarPU allocated them). */
void tnt_dist_held(tnt_handle *hs, int64_t n, int64_t *out)
{
    out[0] = out[1] = 0;
    for (int64_t i = 0; i < n; i++) {
        starpu_data_handle_t d = (starpu_data_handle_t)hs[i];
        int64_t size = (int64_t)starpu_data_get_size(d);
        if (starpu_mpi_data_get_rank(d) == tnt_me)
            out[0] += size;
        if (starpu_data_handle_to_pointer(d, STARPU_MAIN_RAM) != NULL)
            out[1] += size;
    }
}

/* While set, tasks are submitted here without being placed: a read by this rank alone,
   on tiles fetched already. */
void tnt_dist_set_alone(int on) { tnt_dist_alone = on; }

/* Whether a task placed on x runs on this rank. */
int tnt_dist_here(int x) { return x == TNT_DIST_ALL || x == tnt_me; }

/* Bytes sent and received, tasks run here and elsewhere, since the start or the last
   call with ``reset``. */
void tnt_dist_stats(int64_t *out, int reset)
{
    int64_t *c[4] = { &tnt_sent_bytes, &tnt_recv_bytes, &tnt_tasks_here, &tnt_tasks_elsewhere };
    for (int i = 0; i < 4; i++)
        out[i] = reset ? __atomic_exchange_n(c[i], 0, __ATOMIC_RELAXED) : __atomic_load_n(c[i], __ATOMIC_RELAXED);
}

#else  /* built without StarPU-MPI: one process, nothing is ever placed */

int tnt_dist_on;

void tnt_dist_start(int me, int size) { (void)me; (void)size; }

tnt_handle tnt_register_dist(size_t nelems, size_t elemsize, int owner)
{
    (void)nelems; (void)elemsize; (void)owner;
    return NULL;
}

void tnt_set_owner(tnt_handle h, int owner) { (void)h; (void)owner; }

int tnt_dist_place(int n, tnt_handle *handles, int *modes, int prio) { return TNT_DIST_ALL; }

void tnt_dist_after(int n, tnt_handle *handles, int *modes, int x, int prio) {}

int tnt_dist_here(int x) { return 1; }

void tnt_dist_stats(int64_t *out, int reset) { out[0] = out[1] = out[2] = out[3] = 0; }

int tnt_dist_exchange(const void *mine, int64_t nbytes, void *all, double timeout_s)
{
    memcpy(all, mine, (size_t)nbytes);
    return 0;
}

void tnt_mpi_abort(int code) { (void)code; }

int64_t tnt_dist_tag(tnt_handle h) { (void)h; return -1; }
int tnt_dist_owner(tnt_handle h) { (void)h; return -1; }
void tnt_dist_fetch(tnt_handle h, int node) { (void)h; (void)node; }
void tnt_dist_set_alone(int on) { (void)on; }
void tnt_dist_send(tnt_handle h, int dest, int64_t tag) { (void)h; (void)dest; (void)tag; }
void tnt_dist_recv(tnt_handle h, int src, int64_t tag) { (void)h; (void)src; (void)tag; }
void tnt_dist_set_placed(int on) { (void)on; }
void tnt_dist_held(tnt_handle *hs, int64_t n, int64_t *out) { (void)hs; (void)n; out[0] = out[1] = 0; }

#endif
