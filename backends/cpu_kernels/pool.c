/* A small thread pool: the caller and n - 1 workers share each task, chunk by chunk.
 *
 * A task is cut into chunks (a few per thread) that threads take from a shared counter, so
 * a thread the OS has descheduled holds up nothing: the others take its chunks. A decode
 * step dispatches a hundred or more small tasks, so workers spin (with a pause) between
 * tasks instead of sleeping; after SPIN_NS idle they sleep, so an idle app costs no CPU.
 * The caller waits for the last chunk by spinning and then yielding its core. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "kernels.h"

#define SPIN_NS 2000000L /* 2 ms */
#define CHUNKS_PER_THREAD 4

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    /* (generation << 32) | next chunk: a thread takes a chunk only of the task it saw */
    atomic_ullong ticket;
    atomic_int finished; /* chunks of the current task done */
    atomic_int sleepers;
    atomic_int stop;
    task_fn fn;
    void *ctx;
    int chunks;
    int n;       /* threads taking part, the caller included */
    int started; /* workers running */
    pthread_t workers[MAX_POOL_THREADS];
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, NULL, 0, 1, 0, {0}};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Take and run chunks of generation `generation` until none is left. */
static void run_chunks(unsigned long long generation, int thread) {
    for (;;) {
        unsigned long long seen = atomic_load(&pool.ticket);
        if (seen >> 32 != generation || (int)(seen & 0xffffffffu) >= pool.chunks) return;
        if (!atomic_compare_exchange_weak(&pool.ticket, &seen, seen + 1)) continue;
        pool.fn(pool.ctx, (int)(seen & 0xffffffffu), pool.chunks, thread);
        atomic_fetch_add(&pool.finished, 1);
    }
}

static void *worker_main(void *arg) {
    int thread = (int)(intptr_t)arg;
    unsigned long long done_generation = atomic_load(&pool.ticket) >> 32;
    for (;;) {
        long started = now_ns();
        unsigned spins = 0;
        while ((atomic_load(&pool.ticket) >> 32) == done_generation && !atomic_load(&pool.stop)) {
            cpu_relax();
            if ((++spins & 1023) == 0 && now_ns() - started > SPIN_NS) {
                pthread_mutex_lock(&pool.lock);
                atomic_fetch_add(&pool.sleepers, 1);
                while ((atomic_load(&pool.ticket) >> 32) == done_generation && !atomic_load(&pool.stop))
                    pthread_cond_wait(&pool.wake, &pool.lock);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.lock);
            }
        }
        if (atomic_load(&pool.stop)) return NULL;
        done_generation = atomic_load(&pool.ticket) >> 32;
        run_chunks(done_generation, thread);
    }
}

static void stop_workers(void) {
    atomic_store(&pool.stop, 1);
    pthread_mutex_lock(&pool.lock);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    for (int i = 1; i <= pool.started; i++) pthread_join(pool.workers[i], NULL);
    pool.started = 0;
    atomic_store(&pool.stop, 0);
}

void pool_set_threads(int n) {
    if (n < 1) n = 1;
    if (n > MAX_POOL_THREADS - 1) n = MAX_POOL_THREADS - 1;
    if (n == pool.n && pool.started == n - 1) return;
    stop_workers();
    pool.n = 1;
    for (int i = 1; i < n; i++) {
        if (pthread_create(&pool.workers[i], NULL, worker_main, (void *)(intptr_t)i) != 0) break;
        pool.started = i;
        pool.n = i + 1;
    }
}

int pool_threads(void) { return pool.n; }

void pool_run(task_fn fn, void *ctx) {
    if (pool.n == 1) {
        fn(ctx, 0, 1, 0);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    pool.chunks = pool.n * CHUNKS_PER_THREAD;
    atomic_store(&pool.finished, 0);
    unsigned long long generation = (atomic_load(&pool.ticket) >> 32) + 1;
    atomic_store(&pool.ticket, generation << 32); /* publishes fn, ctx and chunks */
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    run_chunks(generation, 0);
    for (unsigned spins = 1; atomic_load(&pool.finished) < pool.chunks; spins++) {
        if (spins & 255) cpu_relax();
        else sched_yield(); /* a worker holding a chunk may be waiting for this core */
    }
}

void split_range(int64_t n, int part, int parts, int64_t *lo, int64_t *hi) {
    int64_t per = n / parts, extra = n % parts;
    *lo = part * per + (part < extra ? part : extra);
    *hi = *lo + per + (part < extra);
}
