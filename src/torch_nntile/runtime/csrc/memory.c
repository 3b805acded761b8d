/* Tile memory and handles: allocating and freeing tiles, registering and
   unregistering their handles, marking a tile that has no memory, and the blobs of
   CPU data copied in.

   Tile memory is allocated here, not by StarPU: StarPU waits forever for memory that
   cannot be had, while a failed allocation here is known at once and becomes a failure
   of the values that need that tile. Out of core (tnt_set_managed) StarPU allocates it,
   so that it can evict it. Each handle's ``user_data`` says whether its
   current value exists (see ``tnt_task_failure`` in failures.c), so that a task whose
   inputs failed skips its kernel and passes the failure on to what it writes. */
#include <starpu.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "shim_internal.h"
#include "typed.h"

/* Tile memory. Large tiles get pages of their own (mmap), small ones come from malloc.
   Tiles live for steps while kernels' temporaries of every size come and go in the
   same heap: with large tiles there too, the heap fragmented (a medium GPT-2's
   process grew by ~150 MiB a step, all of it free heap that could not be returned).
   Pages of their own go back to the system when a tile's memory is freed. */
#define TNT_MMAP_MIN ((size_t)1 << 18)
#define TNT_PAGE ((size_t)4096)

static void *tnt_alloc(size_t nbytes)
{
    if (nbytes >= TNT_MMAP_MIN) {
        void *p = mmap(NULL, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    return posix_memalign(&p, 64, nbytes ? nbytes : 1) == 0 ? p : NULL;
}

static void tnt_free(void *p, size_t nbytes)
{
    if (p == NULL)
        return;
    if (nbytes >= TNT_MMAP_MIN)
        munmap(p, nbytes);
    else
        free(p);
}

/* CPU data copied in (an ingress: an input batch, a dropout mask), held here so that
   the task copying it into tiles runs in C. The Python object that made the copy holds
   one reference and every submitted task that reads it one more: the bytes outlive
   whichever lets go last (Python may drop its copy before the task has run). */
struct tnt_blob { int64_t refs; uint64_t magic; size_t nbytes; };
#define TNT_BLOB_HEAD 64  /* the data after the header stays 64-byte aligned */
#define TNT_BLOB_MAGIC 0x746e745f626c6f62ULL

void *tnt_blob_new(size_t nbytes)
{
    struct tnt_blob *b = tnt_alloc(TNT_BLOB_HEAD + nbytes);
    if (b == NULL)
        return NULL;
    b->refs = 1;
    b->magic = TNT_BLOB_MAGIC;
    b->nbytes = nbytes;
    return (char *)b + TNT_BLOB_HEAD;
}

void tnt_blob_release(void *data)
{
    struct tnt_blob *b = (struct tnt_blob *)((char *)data - TNT_BLOB_HEAD);
    if (__atomic_sub_fetch(&b->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        size_t nbytes = b->nbytes;
        b->magic = 0;
        tnt_free(b, TNT_BLOB_HEAD + nbytes);
    }
}

/* A task's reference to the data a TNT_ROWS_INGRESS record reads (its box copy's
   parameters ``p``, the data's address ``addr``): NULL where that is no blob or too
   small for the boxes' sources. */
void *tnt_blob_hold(const int32_t *p, double addr)
{
    struct tnt_blob *b = (struct tnt_blob *)((char *)(uintptr_t)addr - TNT_BLOB_HEAD);
    if (addr < (double)TNT_BLOB_HEAD || b->magic != TNT_BLOB_MAGIC || tnt_copy_boxes_source_bytes(p, 1) > b->nbytes)
        return NULL;
    __atomic_add_fetch(&b->refs, 1, __ATOMIC_RELAXED);
    return (char *)b + TNT_BLOB_HEAD;
}

/* A registered tile's bytes (see tnt_register: items, or one item of the whole size). */
static size_t tnt_nbytes(starpu_data_handle_t d)
{
    return (size_t)starpu_vector_get_nx(d) * starpu_vector_get_elemsize(d);
}

/* Frees a tile's memory once every earlier task on it is done (its handle is then unregistered). */
void tnt_free_func(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    tnt_free((void *)STARPU_VECTOR_GET_PTR(buffers[0]),
             (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]));
}

struct starpu_codelet tnt_free_cl;

/* Out of core, what a tile holds when a task reads it before any task wrote it (a
   zero-size value's tile, which no task writes): zeros. StarPU runs it where it finds
   no valid copy; without it, StarPU aborts the process on such a read. */
void tnt_init_func(void *buffers[], void *cl_arg)
{
    (void)cl_arg;
    memset((void *)STARPU_VECTOR_GET_PTR(buffers[0]), 0,
           (size_t)STARPU_VECTOR_GET_NX(buffers[0]) * STARPU_VECTOR_GET_ELEMSIZE(buffers[0]));
}

struct starpu_codelet tnt_init_cl;

/* Out of core: tiles whose memory StarPU allocates (on their first write) and may evict
   to a disk node and load back, within STARPU_LIMIT_CPU_MEM. StarPU never evicts memory
   the application supplied, so in this mode no tile memory is allocated here. */
static int tnt_managed;
static size_t tnt_managed_limit;  /* bytes of RAM StarPU may allocate; a larger tile never fits */

void tnt_set_managed(int64_t limit)
{
    tnt_managed = limit > 0;
    tnt_managed_limit = limit > 0 ? (size_t)limit : 0;
}

/* Out of core: a dead tile's value is dropped once its last readers ran, so StarPU
   neither writes it to disk to make room nor reads it back; the memory stays with the
   handle for the next tile of its size. */
void tnt_invalidate_submit(tnt_handle h)
{
    starpu_data_invalidate_submit((starpu_data_handle_t)h);
}

/* A tile of nelems items in memory allocated here, registered with main RAM as its
   home. *allocated = 0 when there is no memory for it: the handle then has none
   (the caller marks it with tnt_set_no_memory before any task uses it) and is
   registered empty: StarPU 1.4 reads a CPU buffer's first and last bytes when it is
   registered. StarPU counts a vector's items in 32 bits: a larger tile is one item of
   its whole size. */
tnt_handle tnt_register(size_t nelems, size_t elemsize, int *allocated)
{
    size_t nbytes = nelems * elemsize;
    int home = STARPU_MAIN_RAM;
    void *p = NULL;
    if (tnt_managed) {  /* no home: StarPU allocates where the first writer runs */
        /* The O_DIRECT disk node moves whole pages: the tile is registered as the pages
           that hold it (every element size divides a page); kernels see only its items.
           A tile larger than the limit would make StarPU wait forever for room. */
        nbytes = (nbytes + TNT_PAGE - 1) / TNT_PAGE * TNT_PAGE;
        nelems = nbytes / elemsize;
        home = -1;
        *allocated = nbytes <= tnt_managed_limit;
    } else {
        p = tnt_alloc(nbytes);
        *allocated = p != NULL;
    }
    starpu_data_handle_t h;
    if (!*allocated)
        starpu_vector_data_register(&h, home, 0, 0, elemsize);
    else if (nelems <= UINT32_MAX)
        starpu_vector_data_register(&h, home, (uintptr_t)p, (uint32_t)nelems, elemsize);
    else
        starpu_vector_data_register(&h, home, (uintptr_t)p, 1, nbytes);
    if (tnt_managed)
        starpu_data_set_reduction_methods(h, NULL, &tnt_init_cl);
    return (tnt_handle)h;
}

void tnt_set_no_memory(tnt_handle h, int64_t failure)
{
    starpu_data_set_user_data((starpu_data_handle_t)h, (void *)((intptr_t)failure * 2 + 1));
}

/* Unregister once the tasks submitted on h are done, then free its memory: a task
   frees it in order after them. */
void tnt_unregister_submit(tnt_handle h)
{
    starpu_data_handle_t d = (starpu_data_handle_t)h;
    if (starpu_data_get_home_node(d) < 0) {  /* out of core: StarPU frees what it allocated */
        starpu_data_unregister_submit(d);
        return;
    }
    struct starpu_task *task = starpu_task_create();
    task->cl = &tnt_free_cl;
    task->handles[0] = d;
    if (starpu_task_submit(task) != 0) {  /* cannot happen with CPU workers; never leak silently */
        void *p = starpu_data_handle_to_pointer(d, STARPU_MAIN_RAM);
        size_t nbytes = tnt_nbytes(d);
        starpu_data_unregister(d);
        tnt_free(p, nbytes);
        return;
    }
    starpu_data_unregister_submit(d);
}

/* Unregister and free now (no task may still use h: after a wait). */
void tnt_unregister_now(tnt_handle h)
{
    starpu_data_handle_t d = (starpu_data_handle_t)h;
    if (starpu_data_get_home_node(d) < 0) {
        starpu_data_unregister_no_coherency(d);
        return;
    }
    void *p = starpu_data_handle_to_pointer(d, STARPU_MAIN_RAM);
    size_t nbytes = tnt_nbytes(d);
    starpu_data_unregister(d);
    tnt_free(p, nbytes);
}
