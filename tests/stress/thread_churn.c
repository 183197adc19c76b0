/* thread_churn — thousands of short-lived threads: created in waves, some
 * joined, some detached, each allocating and freeing a little and exiting.
 * Stresses the recorder's per-thread state (rings handed back at thread
 * exit, thread indices never reused) and ThreadStart/ThreadExit records.
 *
 * TOTAL threads in waves of WAVE; in each wave every 4th thread is created
 * detached. Thread n: 10 x (malloc(64 + n % 32), free); thread n with
 * n % KEEP_EVERY == 0 also calls churn_keep(), which keeps malloc(200).
 * main waits until every thread (detached ones too) has counted itself done.
 *
 * Live from churn_keep() at "done" and at exit:
 *   TOTAL / KEEP_EVERY = 40 blocks, 40 * 200 = 8000 bytes.
 * Output: "thread_churn: 4000 threads". Exit status 0.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <heapsnap/heapsnap.h>

enum { TOTAL = 4000, WAVE = 16, KEEP_EVERY = 100 };

static void* kept[TOTAL / KEEP_EVERY];
static atomic_uint finished;

__attribute__((noinline)) void* churn_keep(void) {
    return malloc(200); /* @site:churn_keep */
}

static void* short_life(void* arg) {
    uintptr_t n = (uintptr_t)arg;
    for (int i = 0; i < 10; ++i) {
        void* volatile p = malloc(64 + n % 32);
        free(p);
    }
    if (n % KEEP_EVERY == 0) kept[n / KEEP_EVERY] = churn_keep();
    atomic_fetch_add(&finished, 1);
    return NULL;
}

int main(void) {
    pthread_attr_t detached;
    pthread_attr_init(&detached);
    pthread_attr_setdetachstate(&detached, PTHREAD_CREATE_DETACHED);
    heapsnap_marker("started");
    for (uintptr_t base = 0; base < TOTAL; base += WAVE) {
        pthread_t wave[WAVE];
        for (uintptr_t i = 0; i < WAVE; ++i) {
            int detach = i % 4 == 3;
            if (pthread_create(&wave[i], detach ? &detached : NULL, short_life, (void*)(base + i)) != 0) return 2;
        }
        for (uintptr_t i = 0; i < WAVE; ++i)
            if (i % 4 != 3) pthread_join(wave[i], NULL);
    }
    while (atomic_load(&finished) < TOTAL) sched_yield();
    heapsnap_marker("done");
    printf("thread_churn: %u threads\n", atomic_load(&finished));
    return 0;
}
