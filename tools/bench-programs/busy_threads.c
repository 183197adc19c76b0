/* A busy server's allocation pattern for the live-snapshot benchmark
 * (tools/bench --snapshots): THREADS threads (default 8) allocate as fast
 * as they can for SECONDS seconds (default 60). Each keeps a window of
 * 4096 live blocks of 16 to 1040 bytes, freeing the oldest as it
 * allocates, and leaks one block in 1024, so the live set grows slowly
 * while the history grows fast. Then it stays quiet for IDLE seconds
 * (default 0), its live set kept, and prints the allocations made.
 *
 *   busy_threads [THREADS [SECONDS [IDLE]]]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum { kWindow = 4096 };

static double g_seconds = 60;
static double g_idle = 0;
static pthread_barrier_t g_done;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void* leak_one(size_t size) { return malloc(size); }

static void* worker(void* arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    void** window = calloc(kWindow, sizeof *window);
    uint64_t made = 0;
    double end = now() + g_seconds;
    while (now() < end) {
        for (int i = 0; i < 4096; ++i) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            size_t slot = seed % kWindow;
            free(window[slot]);
            window[slot] = malloc(16 + (seed >> 32) % 1025);
            if ((seed & 1023) == 0) leak_one(64);
            made++;
        }
    }
    pthread_barrier_wait(&g_done);  /* the quiet phase: the window stays live */
    pthread_barrier_wait(&g_done);
    for (int i = 0; i < kWindow; ++i) free(window[i]);
    free(window);
    return (void*)(uintptr_t)made;
}

int main(int argc, char** argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    if (argc > 2) g_seconds = atof(argv[2]);
    if (argc > 3) g_idle = atof(argv[3]);
    if (threads < 1 || threads > 256 || g_seconds <= 0 || g_idle < 0) {
        fprintf(stderr, "usage: busy_threads [THREADS [SECONDS [IDLE]]]\n");
        return 2;
    }
    pthread_barrier_init(&g_done, NULL, (unsigned)threads + 1);
    pthread_t t[256];
    for (int i = 0; i < threads; ++i) pthread_create(&t[i], NULL, worker, (void*)(uintptr_t)(i + 1));
    pthread_barrier_wait(&g_done);
    usleep((useconds_t)(g_idle * 1e6));
    pthread_barrier_wait(&g_done);
    uint64_t total = 0;
    for (int i = 0; i < threads; ++i) {
        void* made;
        pthread_join(t[i], &made);
        total += (uint64_t)(uintptr_t)made;
    }
    printf("%llu allocations\n", (unsigned long long)total);
    return 0;
}
