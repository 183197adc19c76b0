/* threads_growth — several threads leak between two markers.
 *
 * Marker "A"; then THREADS threads start; thread t (0-based) calls
 * thread_leak(t), which keeps 10 + t blocks of 64 * (t + 1) bytes; all
 * threads are joined; marker "B"; exit 0.
 *
 * Expected diff A -> B for the call site in thread_leak (one stack: every
 * thread runs the same code):
 *   blocks: 10 + 11 + 12 + 13                           = 46
 *   bytes:  10*64 + 11*128 + 12*192 + 13*256            = 7680
 * glibc adds its own per-thread allocations, from stacks through
 * pthread_create.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include <heapsnap/heapsnap.h>

enum { THREADS = 4, MAX_BLOCKS = 13 };

static void* volatile blocks[THREADS][MAX_BLOCKS];

__attribute__((noinline)) void thread_leak(unsigned t) {
    for (unsigned i = 0; i < 10 + t; ++i) blocks[t][i] = malloc(64 * (t + 1)); /* @site:thread_leak */
}

static void* worker(void* arg) {
    thread_leak((unsigned)(uintptr_t)arg);
    return NULL;
}

int main(void) {
    pthread_t threads[THREADS];
    heapsnap_marker("A");
    for (uintptr_t t = 0; t < THREADS; ++t)
        if (pthread_create(&threads[t], NULL, worker, (void*)t) != 0) return 2;
    for (int t = 0; t < THREADS; ++t) pthread_join(threads[t], NULL);
    heapsnap_marker("B");
    return 0;
}
