/* A small thread pool: the caller and n - 1 workers run each task together.
 *
 * A decode step dispatches a hundred or more small tasks, so workers spin (with a pause)
 * for a short while between tasks instead of sleeping on a condition variable; after
 * SPIN_NS of idleness they sleep, so an idle app costs no CPU. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "kernels.h"

#define MAX_THREADS 256
#define SPIN_NS 2000000L /* 2 ms */

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    atomic_long generation;
    atomic_int done;
    atomic_int sleepers;
    atomic_int stop;
    task_fn fn;
    void *ctx;
    int n; /* threads taking part, the caller included */
    int started; /* workers running */
    long first_generation; /* the generation when the workers were started */
    pthread_t workers[MAX_THREADS];
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, NULL, 1, 0, 0, {0}};

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

static void *worker_main(void *arg) {
    int ith = (int)(intptr_t)arg;
    long seen = pool.first_generation; /* not the current one: a task may already be waiting */
    for (;;) {
        long started = now_ns();
        unsigned spins = 0;
        while (atomic_load(&pool.generation) == seen && !atomic_load(&pool.stop)) {
            cpu_relax();
            if ((++spins & 1023) == 0 && now_ns() - started > SPIN_NS) {
                pthread_mutex_lock(&pool.lock);
                atomic_fetch_add(&pool.sleepers, 1);
                while (atomic_load(&pool.generation) == seen && !atomic_load(&pool.stop))
                    pthread_cond_wait(&pool.wake, &pool.lock);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.lock);
            }
        }
        if (atomic_load(&pool.stop)) return NULL;
        seen = atomic_load(&pool.generation);
        if (ith < pool.n) pool.fn(pool.ctx, ith, pool.n);
        atomic_fetch_add(&pool.done, 1);
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
    if (n > MAX_THREADS - 1) n = MAX_THREADS - 1;
    if (n == pool.n && pool.started == n - 1) return;
    stop_workers();
    pool.n = n;
    pool.first_generation = atomic_load(&pool.generation);
    for (int i = 1; i < n; i++) {
        if (pthread_create(&pool.workers[i], NULL, worker_main, (void *)(intptr_t)i) != 0) {
            pool.n = i; /* run with the threads we got */
            break;
        }
        pool.started = i;
    }
}

int pool_threads(void) { return pool.n; }

void pool_run(task_fn fn, void *ctx) {
    if (pool.n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool.fn = fn;
    pool.ctx = ctx;
    atomic_store(&pool.done, 0);
    atomic_fetch_add(&pool.generation, 1);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    fn(ctx, 0, pool.n);
    while (atomic_load(&pool.done) < pool.started) cpu_relax();
}

void split_range(int64_t n, int ith, int nth, int64_t *lo, int64_t *hi) {
    int64_t per = n / nth, extra = n % nth;
    *lo = ith * per + (ith < extra ? ith : extra);
    *hi = *lo + per + (ith < extra);
}
