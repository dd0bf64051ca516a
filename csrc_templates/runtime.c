/* eqfuse's kernel runtime: the state and functions every kernel library shares the text of, the
 * claim-based thread pool and its parallel loops (declared in common_pool.h), the scratch buffers
 * (common.h) and the functions the Python runtime calls on a graph's library beside its kernels.
 *
 * It follows the header (csrc_templates/common*.h) in a translation unit of its own, compiled once
 * per compiler and flags into an object file in the kernel cache and linked into every kernel
 * library (eqfuse.backend.cbuild.runtime_object); an exported library compiles it as one of its
 * sources (eqfuse.export_c). Each library so has its own pool and state, hidden from the others
 * (EQF_HIDDEN), as when this text was part of each library's source. */

/* ---- the scratch buffers (common.h) */
EQF_HIDDEN _Thread_local int eqf_nomem;
static pthread_key_t eqf_scratch_key;
static pthread_once_t eqf_scratch_once = PTHREAD_ONCE_INIT;
static int eqf_scratch_keyed;
static void eqf_scratch_free(void* p)
{
    eqf_scratch_set* s = p;
    for (int i = 0; i < EQF_SCRATCH_SLOTS; i++)
        free(s->buf[i]);
    free(s);
}
static void eqf_scratch_init(void)
{
    if (!eqf_scratch_keyed)
        eqf_scratch_keyed = pthread_key_create(&eqf_scratch_key, eqf_scratch_free) == 0;
}
/* eqfuse's Python runtime gives every module the process's one key (HEADER_C of
 * eqfuse/backend/cbuild.py: eqf_scratch_key_get / eqf_scratch_key_adopt) */
EQF_HIDDEN float* eqf_scratch(int slot, long floats)
{
    pthread_once(&eqf_scratch_once, eqf_scratch_init);
    if (!eqf_scratch_keyed)
        return NULL;
    eqf_scratch_set* s = pthread_getspecific(eqf_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(eqf_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < floats) {
        free(s->buf[slot]);
        s->buf[slot] = NULL;
        s->cap[slot] = 0;
        const long cap = (floats + 15) / 16 * 16; /* aligned_alloc wants a multiple of the alignment */
        const char* lim = getenv("EQFUSE_SCRATCH_LIMIT");
        if (floats < 0 || (unsigned long)cap > (unsigned long)PTRDIFF_MAX / sizeof(float)
            || (lim && *lim && strtod(lim, NULL) < (double)cap * sizeof(float)))
            return NULL;
        if (!(s->buf[slot] = aligned_alloc(64, sizeof(float) * (size_t)cap)))
            return NULL;
        s->cap[slot] = cap;
    }
    return s->buf[slot];
}


/* ---- the pool (common_pool.h) */
EQF_HIDDEN int eqf_pool_request;
EQF_HIDDEN _Thread_local int eqf_region_request;
EQF_HIDDEN _Thread_local int eqf_parallel_team;
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    unsigned long word; /* generation << 32 | next chunk (atomic) */
    long n, done;       /* chunks of the current job, and how many have finished (atomic) */
    int allowed;        /* workers that may take part in the current job */
    eqf_chunk_fn fn;
    void* ctx;
    int workers;        /* started */
} eqf_pool_t;
static eqf_pool_t eqf_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, NULL, 0};
/* held by the caller for a whole job: a second caller at the same time (another Python thread)
 * runs its chunks itself instead of waiting */
static pthread_mutex_t eqf_pool_busy = PTHREAD_MUTEX_INITIALIZER;


/* The counter's low half while the caller writes a new job's fields: no chunk can be claimed. */
#define EQF_POOL_SETTING 0xffffffffUL

static long eqf_pool_now_ns(void);
/* when each worker began the chunk it runs now (monotonic ns; 0: none), read by a caller that
 * waits for it (see EQF_POOL_STALL) */
static long eqf_pool_since[EQF_POOL_MAX];
/* which thread of a job this is: 0 the caller, id + 1 worker id (eqf_runs_claim) */
EQF_HIDDEN _Thread_local int eqf_pool_self;

/* claim and run chunks of generation gen until none is left; id: the worker's, -1 the caller.
 * Returns the chunks it ran. */
static long eqf_pool_drain(unsigned long gen, int id)
{
    long ran = 0;
    for (;;) {
        unsigned long w = __atomic_load_n(&eqf_pool.word, __ATOMIC_ACQUIRE);
        if ((w >> 32) != gen)
            return ran;
        const unsigned long k = w & 0xffffffffUL;
        if (k == EQF_POOL_SETTING) { /* the job is being written: a few stores away */
            eqf_pause();
            continue;
        }
        const eqf_chunk_fn fn = __atomic_load_n(&eqf_pool.fn, __ATOMIC_RELAXED);
        void* const ctx = __atomic_load_n(&eqf_pool.ctx, __ATOMIC_RELAXED);
        const long n = __atomic_load_n(&eqf_pool.n, __ATOMIC_RELAXED);
        /* Fields read from a later job (written after the counter was set to SETTING, behind a
         * release fence) make the claim below fail: the counter is no longer w. */
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if ((long)k >= n)
            return ran;
        if (__atomic_compare_exchange_n(&eqf_pool.word, &w, w + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            if (id >= 0)
                __atomic_store_n(&eqf_pool_since[id], eqf_pool_now_ns(), __ATOMIC_RELAXED);
            fn(ctx, (long)k);
            if (id >= 0)
                __atomic_store_n(&eqf_pool_since[id], 0L, __ATOMIC_RELAXED);
            __atomic_fetch_add(&eqf_pool.done, 1, __ATOMIC_RELEASE);
            ran++;
        }
    }
}

/* A worker spins briefly (EQF_POOL_SPIN pauses, some microseconds) before
 * it sleeps on the condition variable, so that an idle worker does not hold a core another
 * process wants. While the graph's run function holds the pool (eqf_pool_hold: over a run of
 * kernels that use it, with no OpenMP region between them) it spins on, yielding its core every
 * EQF_POOL_SPIN pauses to any other thread that wants it: the next job comes once the caller has
 * packed A, and waking a sleeping worker takes longer than that, and far longer for some jobs
 * (BERT-base at sequence 32, 2 threads: benchmarks/bench_models.py --model bert-base). Released (before an OpenMP region, whose thread then has its core, or at
 * the call's end), it spins at most EQF_POOL_SPIN pauses more. */
enum { EQF_POOL_SPIN = 512 };
static int eqf_pool_hot; /* run functions now holding the pool (eqf_pool_hold) */

/* After a call whose parallel loops ran on the pool (eqf_region with a worker), the workers spin
 * on until EQF_POOL_LINGER_NS after its end (eqf_pool_linger; checked every EQF_POOL_SPIN pauses,
 * yielding the core to any other thread that wants it), then sleep on the condition variable (a
 * futex). A time, not a count of pauses: a call of one parallel region (a single conv called
 * again and again from Python) comes back within tens of microseconds, and a worker woken from
 * sleep came late by more than its half of the region: on two threads such a call ran slower
 * than on one (benchmarks/bench_conv.py --set convnext --threads 1 --threads 2). The linger is
 * a few hundred microseconds, against libgomp's spin of a count of pauses (GOMP_SPINCOUNT, docs/backend.md
 * "Threads"), which eqfuse leaves short for the OpenMP kernels. */
enum { EQF_POOL_LINGER_NS = 300000 };
static long eqf_pool_linger_until; /* monotonic ns until which idle workers spin (atomic) */
EQF_HIDDEN _Thread_local int eqf_region_pooled; /* the calling thread ran an eqf_region on the pool */

/* Where the workers run: on any CPU the process may use except the caller's. Left to the
 * scheduler, a woken worker often went to the caller's CPU (the waker's), where the two took
 * turns: with another process busy on the other core, the MLP at batch 8 on 2 threads ran at
 * its 1-thread time, and even on a quiet machine the 2-thread call was slower. Kept off the
 * caller's CPU, the worker shares the busy core with the other process instead, and the caller
 * claims whatever the worker does not reach (benchmarks/bench_load.py measures both, quiet and
 * busy). The caller publishes its CPU with each job (sched_getcpu: the vDSO, no system call), and
 * a worker moves (sched_setaffinity) only when that CPU has changed or the caller freed it.
 *
 * A worker that the scheduler stops in the middle of a chunk keeps the caller waiting for that
 * chunk until the other thread's time slice ends (milliseconds: the MLP's busy rows of
 * benchmarks/bench_load.py, and every loop of ResNet-18's stages beside onnxruntime, whose
 * thread spins on the worker's core through eqfuse's call: --kind peers). So a caller whose
 * worker has run one chunk EQF_POOL_STALL times as long as the caller's own chunks took on
 * average (at least EQF_POOL_STALL_MIN_NS, at most EQF_POOL_WAIT_NS) takes the worker to its own
 * CPU (sched_setaffinity moves a thread that waits for its turn at once) and sleeps in short naps
 * there: the worker finishes its chunk on the caller's core, and moves back off it at its next
 * eqf_pool_place. (Before, the caller waited a fixed EQF_POOL_WAIT_NS, then left the worker free
 * to run anywhere for the scheduler to move: long against one conv's loop, and beside a spinning
 * peer the worker is stopped in most loops.) */
enum { EQF_POOL_WAIT_NS = 100000, EQF_POOL_NAP_NS = 20000, EQF_POOL_STALL = 3, EQF_POOL_STALL_MIN_NS = 5000 };
static int eqf_pool_caller_cpu = -1;
static unsigned eqf_pool_freed;          /* times the caller took a worker to its CPU (atomic) */
static int eqf_pool_pulled[EQF_POOL_MAX]; /* the worker was taken to the caller's CPU (atomic) */
#if defined(__linux__)
EQF_HIDDEN pid_t eqf_pool_tid[EQF_POOL_MAX]; /* the workers' thread ids (0: not started yet) */
static cpu_set_t eqf_pool_base;          /* the CPUs the first caller could use (the workers') */
#endif

static void eqf_pool_publish_cpu(void)
{
#if defined(__linux__)
    __atomic_store_n(&eqf_pool_caller_cpu, sched_getcpu(), __ATOMIC_RELAXED);
#endif
}

/* Called by a worker when it wakes and before each job: keep off the caller's CPU. *off: the CPU
 * it keeps off now (-1: none, CPU_SETSIZE: never move), *freed: eqf_pool_freed when it last
 * moved; a worker the caller took to its CPU (eqf_pool_pull) moves back. */
static void eqf_pool_place(int id, int* off, unsigned* freed)
{
#if defined(__linux__)
    const int c = __atomic_load_n(&eqf_pool_caller_cpu, __ATOMIC_RELAXED);
    const unsigned f = __atomic_load_n(&eqf_pool_freed, __ATOMIC_RELAXED);
    const int pulled = __atomic_exchange_n(&eqf_pool_pulled[id], 0, __ATOMIC_ACQ_REL);
    if ((c == *off && f == *freed && !pulled) || c < 0 || c >= CPU_SETSIZE || *off >= CPU_SETSIZE)
        return;
    cpu_set_t s = eqf_pool_base;
    if (CPU_ISSET(c, &s) && CPU_COUNT(&s) > 1)
        CPU_CLR(c, &s);
    sched_setaffinity(0, sizeof s, &s); /* (on failure the worker runs where it is: no harm) */
    *off = c;
    *freed = f;
#else
    (void)id;
    (void)off;
    (void)freed;
#endif
}

/* Called by the caller that waits: take each worker whose chunk began before `before` (ns) to
 * the caller's CPU (see above); with `every`, each worker (one stopped between its claim and
 * the clock's read). Returns whether it took any. */
static int eqf_pool_pull(long before, int every)
{
    int any = 0;
#if defined(__linux__)
    const int c = sched_getcpu();
    cpu_set_t s;
    CPU_ZERO(&s);
    if (c >= 0 && c < CPU_SETSIZE)
        CPU_SET(c, &s);
    else
        s = eqf_pool_base;
    for (int i = 0; i < EQF_POOL_MAX; i++) {
        const pid_t t = __atomic_load_n(&eqf_pool_tid[i], __ATOMIC_RELAXED);
        if (t == 0)
            break;
        const long since = __atomic_load_n(&eqf_pool_since[i], __ATOMIC_RELAXED);
        if (!every && (since == 0 || since >= before))
            continue;
        /* (the flag after the move: a worker that finishes the chunk first moves back at its next
         * eqf_pool_place all the same) */
        if (sched_setaffinity(t, sizeof s, &s) == 0) {
            __atomic_store_n(&eqf_pool_pulled[i], 1, __ATOMIC_RELEASE);
            any = 1;
        }
    }
    if (any)
        __atomic_fetch_add(&eqf_pool_freed, 1, __ATOMIC_RELAXED);
#else
    (void)before;
    (void)every;
#endif
    return any;
}

static long eqf_pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

/* A worker whose core another thread shares (a peer runtime's pool spinning after its run,
 * benchmarks/bench_load.py --kind peers) does not spin between jobs: a thread that yields its core
 * to one that spins without yielding gets it back only at the next scheduler tick, milliseconds
 * later, so the job came and went without it. It sleeps on the condition variable instead, and
 * each job's broadcast wakes it: a woken thread preempts a spinning one at once (with the short
 * time slice it asks for, eqf_pool_short_slice). It finds its core shared when one pass of its
 * spin (EQF_POOL_SPIN pauses and a sched_yield) took longer than EQF_POOL_SHARED_NS: another
 * thread ran there meanwhile. For EQF_POOL_SHARED_HOLD_NS after that it spins one pass without
 * yielding after each job (the next loop of a call often comes within it: no wake-up) and then
 * sleeps, and after that it spins as before if its core has been its own
 * (benchmarks/bench_load.py --kind peers). */
enum { EQF_POOL_SHARED_NS = 200000, EQF_POOL_SHARED_HOLD_NS = 20000000 };
EQF_HIDDEN unsigned eqf_pool_shared_seen; /* times a worker found its core shared (atomic; tests read it) */

/* The worker's time slice: the shortest the scheduler takes (Linux's EEVDF reads a fair thread's
 * sched_attr.sched_runtime as its slice request, and takes none shorter than this). A thread with a shorter slice
 * preempts one with a longer slice when it wakes, so a woken worker runs at once beside another
 * runtime's spinning thread rather than at its next tick. Only the pool's own threads ask; a
 * kernel that does not know the field refuses it, and the worker keeps its slice. */
enum { EQF_POOL_SLICE_NS = 100000 };
static void eqf_pool_short_slice(void)
{
#if defined(__linux__) && defined(SYS_sched_setattr) && defined(SYS_sched_getattr)
    struct {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;
    } at;
    memset(&at, 0, sizeof at);
    if (syscall(SYS_sched_getattr, 0, &at, (unsigned)sizeof at, 0) != 0 || at.policy != 0 /* SCHED_OTHER */)
        return;
    at.size = sizeof at;
    at.runtime = EQF_POOL_SLICE_NS;
    (void)syscall(SYS_sched_setattr, 0, &at, 0);
#endif
}

static void* eqf_pool_worker(void* arg)
{
    const int id = (int)(long)arg;
    eqf_pool_self = id + 1;
    unsigned long seen = 0;
    int off = -1;
    unsigned freed = 0;
    long shared_until = 0; /* while the clock is below it, sleep between jobs (see EQF_POOL_SHARED_NS) */
    eqf_pool_short_slice();
#if defined(__linux__)
    if (CPU_COUNT(&eqf_pool_base) == 0)
        off = CPU_SETSIZE; /* the CPUs are not known: never moved */
    __atomic_store_n(&eqf_pool_tid[id], (pid_t)syscall(SYS_gettid), __ATOMIC_RELAXED);
#endif
    for (;;) {
        eqf_pool_place(id, &off, &freed); /* (woken by a job or by eqf_pool_hold) */
        for (;;) { /* until a new job is published */
            long pass = eqf_pool_now_ns();
            int sleep = 0;
            for (int spin = 1;; spin++) {
                const int job = (__atomic_load_n(&eqf_pool.word, __ATOMIC_ACQUIRE) >> 32) != seen;
                if (!job && spin < EQF_POOL_SPIN) {
                    eqf_pause();
                    continue;
                }
                const long now = eqf_pool_now_ns();
                if (now - pass > EQF_POOL_SHARED_NS) { /* another thread ran on this core meanwhile */
                    shared_until = now + EQF_POOL_SHARED_HOLD_NS;
                    __atomic_fetch_add(&eqf_pool_shared_seen, 1, __ATOMIC_RELAXED);
                }
                if (job)
                    break;
                if (now < shared_until) { /* a core shared: the next job did not come within one pass */
                    sleep = 1;
                    break;
                }
                if (__atomic_load_n(&eqf_pool_hot, __ATOMIC_RELAXED) <= 0
                    && now >= __atomic_load_n(&eqf_pool_linger_until, __ATOMIC_RELAXED))
                    break;
                /* held, or lingering (EQF_POOL_LINGER_NS): give the core to any thread that wants it
                 * (released, it spins EQF_POOL_SPIN pauses more, as after a job) */
                sched_yield();
                pass = now;
                spin = 0;
            }
            if ((__atomic_load_n(&eqf_pool.word, __ATOMIC_ACQUIRE) >> 32) != seen)
                break;
            pthread_mutex_lock(&eqf_pool.mu);
            while ((__atomic_load_n(&eqf_pool.word, __ATOMIC_ACQUIRE) >> 32) == seen
                   && (sleep || __atomic_load_n(&eqf_pool_hot, __ATOMIC_RELAXED) <= 0))
                pthread_cond_wait(&eqf_pool.wake, &eqf_pool.mu);
            pthread_mutex_unlock(&eqf_pool.mu);
        }
        unsigned long w;
        while (((w = __atomic_load_n(&eqf_pool.word, __ATOMIC_ACQUIRE)) & 0xffffffffUL) == EQF_POOL_SETTING)
            eqf_pause(); /* the job is being written */
        seen = w >> 32;
        eqf_pool_place(id, &off, &freed);
        /* (allowed was written before chunk 0 was published, with release order) */
        if (id < __atomic_load_n(&eqf_pool.allowed, __ATOMIC_RELAXED))
            eqf_pool_drain(seen, id);
    }
    return NULL;
}


/* OpenMP's worker threads are not placed like the pool's: they are the process's (one libgomp,
 * shared with torch and any other OpenMP code loaded), and eqfuse changes no thread it does not
 * own (docs/backend.md, "Threads"). */

/* The run function's hold on the pool (*held: whether it holds it now). on = 1 before a kernel
 * that uses the pool, when the call may use more than one thread: the workers spin between jobs
 * instead of sleeping, and a sleeping one is woken now, so that it spins by the time the job
 * comes. on = 0 before a kernel that may open an OpenMP region, and at the call's end; it also
 * ends the workers' linger after the last call (eqf_pool_linger). */
EQF_HIDDEN void eqf_pool_hold(int* held, int on)
{
    if (on && !*held && eqf_pool_threads() > 1 && !eqf_parallel_team) { /* (else no loop runs on the pool) */
        eqf_pool_publish_cpu();
        pthread_mutex_lock(&eqf_pool.mu);
        __atomic_fetch_add(&eqf_pool_hot, 1, __ATOMIC_RELAXED);
        if (eqf_pool.workers > 0)
            pthread_cond_broadcast(&eqf_pool.wake);
        pthread_mutex_unlock(&eqf_pool.mu);
        *held = 1;
    } else if (!on && *held) {
        __atomic_fetch_sub(&eqf_pool_hot, 1, __ATOMIC_RELAXED);
        *held = 0;
    }
    if (!on && __atomic_load_n(&eqf_pool_linger_until, __ATOMIC_RELAXED) != 0) /* (an OpenMP kernel's threads want the cores) */
        __atomic_store_n(&eqf_pool_linger_until, 0, __ATOMIC_RELAXED);
}

/* The run function's end: after a call that ran an eqf_region on the pool, the workers linger
 * (EQF_POOL_LINGER_NS); after any other, they stop lingering (an OpenMP kernel's threads want the
 * cores). */
EQF_HIDDEN void eqf_pool_linger(void)
{
    __atomic_store_n(&eqf_pool_linger_until, eqf_region_pooled ? eqf_pool_now_ns() + EQF_POOL_LINGER_NS : 0,
                     __ATOMIC_RELAXED);
    eqf_region_pooled = 0;
}

/* eqf_parallel_for's chunks on OpenMP's team, claimed one at a time from a counter: the call's
 * mode is OpenMP's (every core free, a graph with OpenMP kernels), and its team is the one that
 * runs the other kernels' regions. On the pool, each switch between a pool kernel and an OpenMP
 * kernel found the other set's worker asleep (the pool's after EQF_POOL_SPIN pauses, OpenMP's after
 * GOMP_SPINCOUNT), and waking it cost more than a small kernel's work: a quantize_static BERT-base's
 * pointwise kernels after its integer GEMMs ran slower on 2 threads than on 1
 * (benchmarks/bench_models.py --quantized static --model bert-base). Which thread runs a chunk
 * changes nothing in the result, as on the pool. */
EQF_HIDDEN void eqf_team_for(long n, eqf_chunk_fn fn, void* ctx, int threads)
{
#if defined(_OPENMP)
    long next = 0;
#pragma omp parallel num_threads(threads)
    {
        const int self = eqf_pool_self;
        eqf_pool_self = omp_get_thread_num(); /* (0: the caller, as on the pool: eqf_runs_claim) */
        for (long k; (k = __atomic_fetch_add(&next, 1, __ATOMIC_RELAXED)) < n;)
            fn(ctx, k);
        eqf_pool_self = self;
    }
#else
    for (long k = 0; k < n; k++)
        fn(ctx, k);
    (void)threads;
#endif
}

EQF_HIDDEN void eqf_parallel_for(long n, eqf_chunk_fn fn, void* ctx, int threads)
{
    if (threads > EQF_POOL_MAX)
        threads = EQF_POOL_MAX;
#if defined(_OPENMP)
    if (eqf_parallel_team && threads > 1 && n > 1 && !omp_in_parallel()) {
        eqf_team_for(n, fn, ctx, threads);
        return;
    }
#endif
    if (threads <= 1 || n <= 1 || n >= (long)EQF_POOL_SETTING || pthread_mutex_trylock(&eqf_pool_busy) != 0) {
        for (long k = 0; k < n; k++)
            fn(ctx, k);
        return;
    }
    eqf_pool_publish_cpu();
    pthread_mutex_lock(&eqf_pool.mu);
#if defined(__linux__)
    if (eqf_pool.workers == 0 && sched_getaffinity(0, sizeof eqf_pool_base, &eqf_pool_base) != 0)
        CPU_ZERO(&eqf_pool_base);
#endif
    while (eqf_pool.workers < threads - 1) { /* start the missing workers (detached, for the process's life) */
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        const int ok = pthread_create(&t, &at, eqf_pool_worker, (void*)(long)eqf_pool.workers) == 0;
        pthread_attr_destroy(&at);
        if (!ok)
            break;
        eqf_pool.workers++;
    }
    /* Publish the job: first the new generation with no chunk to claim (a worker still holding
     * the last job's counter can no longer claim from it), then the fields, then chunk 0. */
    const unsigned long gen = ((__atomic_load_n(&eqf_pool.word, __ATOMIC_RELAXED) >> 32) + 1) & 0xffffffffUL;
    __atomic_store_n(&eqf_pool.word, gen << 32 | EQF_POOL_SETTING, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&eqf_pool.fn, fn, __ATOMIC_RELAXED);
    __atomic_store_n(&eqf_pool.ctx, ctx, __ATOMIC_RELAXED);
    __atomic_store_n(&eqf_pool.n, n, __ATOMIC_RELAXED);
    __atomic_store_n(&eqf_pool.allowed, threads - 1, __ATOMIC_RELAXED);
    __atomic_store_n(&eqf_pool.done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&eqf_pool.word, gen << 32, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&eqf_pool.wake);
    pthread_mutex_unlock(&eqf_pool.mu);
    const long start = eqf_pool_now_ns();
    const long ran = eqf_pool_drain(gen, -1);
    /* every chunk is claimed: wait for the ones running on workers (see EQF_POOL_STALL) */
    long stall = ran > 0 ? EQF_POOL_STALL * (eqf_pool_now_ns() - start) / ran : EQF_POOL_WAIT_NS;
    stall = stall < EQF_POOL_STALL_MIN_NS ? EQF_POOL_STALL_MIN_NS : stall > EQF_POOL_WAIT_NS ? EQF_POOL_WAIT_NS : stall;
    int pulled = 0;
    const long waiting = eqf_pool_now_ns();
    for (long spins = 1; __atomic_load_n(&eqf_pool.done, __ATOMIC_ACQUIRE) < n; spins++) {
        if (!pulled && spins % 64 == 0) {
            const long now = eqf_pool_now_ns();
            pulled = eqf_pool_pull(now - stall, now - waiting > EQF_POOL_WAIT_NS);
        }
        if (pulled) {
            const struct timespec nap = {0, EQF_POOL_NAP_NS};
            nanosleep(&nap, NULL);
        } else
            eqf_pause();
    }
    pthread_mutex_unlock(&eqf_pool_busy);
}


/* The caller claims ranges from the front, the workers from the back: each thread keeps to its
 * own end of the loop, as a static split would (the items a thread wrote in one loop are in its
 * core's caches when the next loop reads them), and the two ends meet wherever the threads'
 * speeds put them. Each run of eqf_region_chunk claims one range, and the pool runs it once per
 * range, so every range is claimed exactly once. */
static _Thread_local int eqf_region_front;

static void eqf_region_chunk(void* job, long k)
{
    eqf_region_job* r = job;
    (void)k;
    unsigned long w = __atomic_load_n(&r->ends, __ATOMIC_ACQUIRE), next;
    long c;
    do {
        const long first = (long)(w >> 32), end = (long)(w & 0xffffffffUL);
        if (first >= end)
            return; /* (not reached: as many claims as ranges) */
        c = eqf_region_front ? first : end - 1;
        next = eqf_region_front ? w + (1UL << 32) : w - 1;
    } while (!__atomic_compare_exchange_n(&r->ends, &w, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
    const long lo = c * r->per;
    r->fn(r->ctx, lo, r->n - lo < r->per ? r->n : lo + r->per);
}


/* eqf_region with `nchunks` equal ranges on the pool rather than EQF_REGION_CHUNKS: a kernel whose
 * plan says its loop's items are costly enough that finer ranges pay (a conv's region_chunks:
 * eqfuse.backend.kinds.contraction.conv.region_chunks), so that the thread that runs out of
 * ranges first waits less for the other's last one. */
EQF_HIDDEN void eqf_region_n(long n, eqf_range_fn fn, void* ctx, int parallel, long nchunks)
{
    const int pool = eqf_region_request;
    if (parallel && pool == 0 && n > 1) {
#if defined(_OPENMP)
#pragma omp parallel if (omp_get_max_threads() > 1)
        {
            const long nt = omp_get_num_threads(), me = omp_get_thread_num();
            const long lo = n * me / nt, hi = n * (me + 1) / nt;
            if (lo < hi)
                fn(ctx, lo, hi);
        }
        return;
#endif
    }
    const int threads = parallel ? pool : 1;
    if (threads <= 1 || n <= 1) {
        if (n > 0)
            fn(ctx, 0, n);
        return;
    }
    const long per = (n + nchunks - 1) / nchunks, chunks = (n + per - 1) / per;
    eqf_region_job job = {fn, ctx, n, per, (unsigned long)chunks};
    eqf_region_front = 1;
    eqf_region_pooled = 1;
    eqf_parallel_for(chunks, eqf_region_chunk, &job, threads);
    eqf_region_front = 0;
}


/* ---- what the Python runtime calls on a graph's library (eqfuse.backend.cbuild.RUNTIME_CDEF)
 * One pthread key of scratch buffers for the process (a process has only PTHREAD_KEYS_MAX = 1024
 * of them, and may load more libraries than that): the runtime takes the first library's key and
 * hands it to each later library before its first call (eqfuse.runtime.program.share_scratch_key).
 * Every library has the same header, so they agree on the layout of eqf_scratch_set, and libraries
 * are never unloaded, so the destructor of the library that made the key stays callable. The
 * libraries of a thread then share its buffers too, as the kernels of one library do: a thread
 * runs one graph call at a time. */
EQF_HIDDEN long eqf_scratch_key_get(void)
{
    pthread_once(&eqf_scratch_once, eqf_scratch_init);
    return eqf_scratch_keyed ? (long)eqf_scratch_key : -1;
}
EQF_HIDDEN void eqf_scratch_key_adopt(long key)
{
    if (!eqf_scratch_keyed) {
        eqf_scratch_key = (pthread_key_t)key;
        eqf_scratch_keyed = 1;
    }
}
/* the thread ids of this library's claim-based pool workers (common_pool.h; 0: not started), which
 * the runtime reads without a call: the call's own threads, as its OpenMP team is (eqfuse.runtime.load) */
EQF_HIDDEN const int* eqf_pool_tids(void)
{
#if defined(__linux__)
    return (const int*)eqf_pool_tid;
#else
    static const int none[EQF_POOL_MAX];
    return none;
#endif
}
