/* eqfuse common header, continued (after common_simd.h): the claim-based thread pool. */
/* ---- A claim-based thread pool (the skinny GEMM's parallel loop).
 * eqf_parallel_for(n, fn, ctx, threads) runs fn(ctx, 0..n-1), each chunk once, on the calling
 * thread and on up to threads - 1 pool workers. Chunks are claimed one at a time from an atomic
 * counter, and the caller waits only for the chunks that were claimed, never for a worker that
 * has not started: when another process holds a core and a worker is not scheduled, the caller
 * takes its chunks itself. (An OpenMP region waits at its end for every thread of the team.)
 * The counter holds the job's generation in its high half, so a worker waking late cannot claim
 * a chunk of a later job. One pool per library, its workers started at its first parallel call. */
typedef void (*eqf_chunk_fn)(void* ctx, long chunk);
enum { EQF_POOL_MAX = 64 };

static inline void eqf_pause(void)
{
#if defined(__SSE2__)
    __builtin_ia32_pause();
#endif
}

/* The pool's functions and state are defined once per library in csrc_templates/runtime.c,
 * compiled once per compiler and flags and linked into every kernel library
 * (eqfuse.backend.cbuild.runtime_object); a kernel sees these declarations. */
/* which thread of a job this is: 0 the caller, id + 1 worker id (eqf_runs_claim) */
extern EQF_HIDDEN _Thread_local int eqf_pool_self;
/* the calling thread ran an eqf_region on the pool (eqf_pool_linger) */
extern EQF_HIDDEN _Thread_local int eqf_region_pooled;
#if defined(__linux__)
extern EQF_HIDDEN pid_t eqf_pool_tid[EQF_POOL_MAX]; /* the workers' thread ids (0: not started yet) */
#endif
extern EQF_HIDDEN unsigned eqf_pool_shared_seen; /* times a worker found its core shared (atomic; tests read it) */

/* The threads a pool job may use in the current call, set by the graph's run function. The
 * Python runtime gives it the count asked for, even when other processes hold cores (OpenMP then
 * gets only the free cores): the caller never waits for a worker that has not started, and the
 * worker runs off the caller's CPU (eqf_pool_place). 0: OpenMP's. */
#if defined(_OPENMP)
#include <omp.h>
#endif
extern EQF_HIDDEN int eqf_pool_request;
/* The call's mode for its parallel loops (eqf_region below), set by the graph's run function on
 * the calling thread (the thread that runs every kernel and opens every loop): 0 OpenMP's static
 * split, k > 0 the claim-based pool with k threads. Each calling thread has its own. */
extern EQF_HIDDEN _Thread_local int eqf_region_request;
/* Whether eqf_parallel_for runs its chunks on OpenMP's team (eqf_team_for) rather than on the
 * pool: set by the run function for a call in OpenMP's mode (eqf_region_request 0, more than one
 * thread); 0 elsewhere (a kernel's own harness calls the pool). */
extern EQF_HIDDEN _Thread_local int eqf_parallel_team;
__attribute__((unused)) static int eqf_pool_threads(void)
{
    const int n = __atomic_load_n(&eqf_pool_request, __ATOMIC_RELAXED);
#if defined(_OPENMP)
    return n > 0 ? n : omp_get_max_threads();
#else
    return n > 0 ? n : 1;
#endif
}

/* The run function's hold on the pool (*held: whether it holds it now), before a kernel that
 * uses the pool (on = 1) or one that may open an OpenMP region and at the call's end (on = 0);
 * the run function's end (eqf_pool_linger); eqf_parallel_for(n, fn, ctx, threads) runs
 * fn(ctx, 0..n-1) on the pool (above), or on OpenMP's team in a call in OpenMP's mode
 * (eqf_team_for). Each is described where runtime.c defines it. */
EQF_HIDDEN void eqf_pool_hold(int* held, int on);
EQF_HIDDEN void eqf_pool_linger(void);
EQF_HIDDEN void eqf_team_for(long n, eqf_chunk_fn fn, void* ctx, int threads);
EQF_HIDDEN void eqf_parallel_for(long n, eqf_chunk_fn fn, void* ctx, int threads);

/* ---- A job's items as one contiguous run per thread (the skinny GEMM's panels, the plan's `runs`).
 * eqf_parallel_for hands out chunk numbers in the order they are claimed, so on two threads
 * each thread's panels alternate with the other's: every thread's stream of B jumps at every
 * panel (K x NR elements), and the hardware prefetcher starts each panel's stream anew. With
 * runs, thread t (the caller 0, worker id id + 1) owns the items [t n / T, (t + 1) n / T) and
 * claims them in order from the front of its run, so each thread reads one sequential stream,
 * as a static split would; a thread whose run is done takes the others' items one at a time
 * from the back of their runs, so a worker that another process keeps from its core holds up at
 * most the item it runs, as with chunk claims. Each chunk the pool runs claims exactly one item
 * (eqf_runs_claim), and the pool runs as many chunks as there are items, so every item is
 * claimed once. Each run's word (first << 32 | end) sits on a cache line of its own: a thread
 * claims its own items without touching the others' line. */
typedef struct {
    unsigned long word __attribute__((aligned(64)));
} eqf_run_t;
typedef struct {
    eqf_run_t run[EQF_POOL_MAX];
    int runs;
} eqf_runs_t;

__attribute__((unused)) static void eqf_runs_init(eqf_runs_t* r, long n, int threads)
{
    r->runs = threads < 1 ? 1 : threads > EQF_POOL_MAX ? EQF_POOL_MAX : threads;
    for (int t = 0; t < r->runs; t++)
        r->run[t].word = (unsigned long)(n * t / r->runs) << 32 | (unsigned long)(n * (t + 1) / r->runs);
}

/* the next item for the calling thread: from the front of its own run, else from the back of
 * another's (-1 only if every item was claimed, which the pool's chunk count rules out) */
__attribute__((unused)) static long eqf_runs_claim(eqf_runs_t* r)
{
    const int me = eqf_pool_self < r->runs ? eqf_pool_self : 0;
    unsigned long w = __atomic_load_n(&r->run[me].word, __ATOMIC_ACQUIRE);
    while ((w >> 32) < (w & 0xffffffffUL))
        if (__atomic_compare_exchange_n(&r->run[me].word, &w, w + (1UL << 32), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            return (long)(w >> 32);
    for (int d = 1; d < r->runs; d++) {
        eqf_run_t* o = &r->run[(me + d) % r->runs];
        w = __atomic_load_n(&o->word, __ATOMIC_ACQUIRE);
        while ((w >> 32) < (w & 0xffffffffUL))
            if (__atomic_compare_exchange_n(&o->word, &w, w - 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
                return (long)(w & 0xffffffffUL) - 1;
    }
    return -1;
}

/* ---- A kernel's parallel loop (eqf_region), run in the mode the call picked.
 * eqf_region(n, fn, ctx, parallel) runs fn(ctx, lo, hi) over ranges that cover the items 0..n-1
 * once each. With `parallel` (the plan's), the call's mode (eqf_region_request, set by the graph's
 * run function from eqfuse.runtime.load.region_mode) says how:
 * - 0, every core free: OpenMP's static split, one range per thread of OpenMP's team (the count
 *   the run function set). Fastest when each thread has a core, and torch's OpenMP workers, which
 *   share eqfuse's libgomp, are this team: spinning after torch's run they take the region at once.
 * - k > 0, another runtime's threads running in this process (or k = 1, cores taken by other
 *   processes): chunks of the claim-based pool above with k threads. Its caller never waits for
 *   a thread that has not started: beside onnxruntime's or OpenVINO's spinning threads the caller
 *   claims every chunk the worker does not reach, so the loop costs at most what one thread costs,
 *   and a peer that stops spinning gives its core back to the worker mid-call
 *   (benchmarks/bench_load.py --kind peers). An OpenMP barrier there waited for a thread with no core.
 * Without `parallel`, one range on the calling thread. Each item's arithmetic is the template's
 * and the plan's whichever thread runs it and whatever range holds it, so the result does not
 * depend on the mode or the thread count (tests/test_regions.py). On the pool the ranges are
 * EQF_REGION_CHUNKS equal runs of items (a scheduling constant, not a choice of the result): few
 * claims on the shared word, and a worker stopped by the scheduler in the middle of one holds up
 * at most that share of the loop. */
typedef void (*eqf_range_fn)(void* ctx, long lo, long hi);
enum { EQF_REGION_CHUNKS = 64 };
typedef struct {
    eqf_range_fn fn;
    void* ctx;
    long n, per;
    unsigned long ends; /* the ranges not yet claimed: first << 32 | last + 1 (atomic) */
} eqf_region_job;
/* eqf_region with `nchunks` equal ranges on the pool rather than EQF_REGION_CHUNKS: a kernel whose
 * plan says its loop's items are costly enough that finer ranges pay (a conv's region_chunks:
 * eqfuse.backend.kinds.contraction.conv.region_chunks), so that the thread that runs out of
 * ranges first waits less for the other's last one. (runtime.c) */
EQF_HIDDEN void eqf_region_n(long n, eqf_range_fn fn, void* ctx, int parallel, long nchunks);

/* Whether the call's loops run on the claim-based pool with a worker (the run function then
 * holds the pool over their kernels: eqfuse.runtime.program.HOLD_REGIONS). */
__attribute__((unused)) static int eqf_region_on_pool(void)
{
    return eqf_region_request > 1;
}

__attribute__((unused)) static void eqf_region(long n, eqf_range_fn fn, void* ctx, int parallel)
{
    eqf_region_n(n, fn, ctx, parallel, EQF_REGION_CHUNKS);
}


/* What the Python runtime calls on a graph's library beside its kernels (runtime.c;
 * eqfuse.backend.cbuild.HEADER_CDEF): the library's scratch key, and its pool workers' thread ids. */
EQF_HIDDEN long eqf_scratch_key_get(void);
EQF_HIDDEN void eqf_scratch_key_adopt(long key);
EQF_HIDDEN const int* eqf_pool_tids(void);
