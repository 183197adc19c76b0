/* threads16 — sixteen threads allocate at once, through every allocation
 * function, with blocks of mixed lifetimes.
 *
 * Each thread t runs ROUNDS rounds of churn: malloc, calloc, realloc,
 * posix_memalign and aligned_alloc of sizes 8..519, held in a small ring of
 * the thread's own and freed when the ring slot is reused (all freed before
 * the thread ends). Every KEEP_EVERY-th round it also calls keep_block(),
 * which keeps malloc(100 + t) for good.
 *
 * Live from keep_block() at "joined" and at exit:
 *   blocks: THREADS * ROUNDS / KEEP_EVERY           = 16 * 40 = 640
 *   bytes:  40 * sum over t of (100 + t)            = 40 * 1720 = 68800
 * Nothing else in this file stays allocated.
 * Markers: "started" before the first thread, "joined" after the last join.
 * Output: "threads16: 16 threads, 640 blocks kept". Exit status 0.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <heapsnap/heapsnap.h>

enum { THREADS = 16, ROUNDS = 20000, KEEP_EVERY = 500, RING = 64, KEPT_PER_THREAD = ROUNDS / KEEP_EVERY };

static void* kept[THREADS][KEPT_PER_THREAD];

__attribute__((noinline)) void* keep_block(size_t size) {
    return malloc(size); /* @site:keep_block */
}

__attribute__((noinline)) static void* churn_block(unsigned i, size_t size, void* old) {
    void* p = NULL;
    switch (i % 5) {
        case 0: return malloc(size);
        case 1: return calloc(1, size);
        case 2: return realloc(old, size); /* takes over the ring's old block */
        case 3: return posix_memalign(&p, 64, size) == 0 ? p : NULL;
        default: return aligned_alloc(32, (size + 31) & ~(size_t)31);
    }
}

static void* worker(void* arg) {
    uintptr_t t = (uintptr_t)arg;
    void* ring[RING] = {0};
    for (unsigned i = 0; i < ROUNDS; ++i) {
        unsigned slot = (i * 7 + (unsigned)t) % RING;
        size_t size = 8 + (i * 13 + t) % 512;
        void* old = ring[slot];
        ring[slot] = NULL;
        void* p = churn_block(i, size, old);
        if (!p) abort();
        if (i % 5 != 2) free(old);
        ring[slot] = p;
        if (i % KEEP_EVERY == 0) kept[t][i / KEEP_EVERY] = keep_block(100 + t);
    }
    for (unsigned s = 0; s < RING; ++s) free(ring[s]);
    return NULL;
}

int main(void) {
    pthread_t threads[THREADS];
    heapsnap_marker("started");
    for (uintptr_t t = 0; t < THREADS; ++t)
        if (pthread_create(&threads[t], NULL, worker, (void*)t) != 0) return 2;
    for (int t = 0; t < THREADS; ++t) pthread_join(threads[t], NULL);
    heapsnap_marker("joined");
    unsigned count = 0;
    for (int t = 0; t < THREADS; ++t)
        for (int k = 0; k < KEPT_PER_THREAD; ++k) count += kept[t][k] != NULL;
    printf("threads16: %d threads, %u blocks kept\n", THREADS, count);
    return 0;
}
