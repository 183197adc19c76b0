/* Synthetic allocation benchmark for tools/bench.
 *
 *   alloc_bench THREADS EVENTS_PER_THREAD DEPTH LIVE_SET
 *
 * Each thread recurses DEPTH frames deep, then allocates and frees in a
 * loop: sizes cycle through 16..4111 bytes, and every allocation replaces a
 * random slot of a per-thread live set of LIVE_SET blocks (so frees hit
 * blocks of every age, as in real programs). EVENTS_PER_THREAD counts
 * malloc and free calls together. Exits 0; prints nothing.
 *
 * With ALLOC_BENCH_GATE set in the environment it first waits for one byte
 * on stdin (tools/bench --attach attaches a tool meanwhile, to a process
 * blocked in read).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

static long events_per_thread = 2000000;
static int depth = 20;
static long live_set = 1000;

static uint64_t next_random(uint64_t* state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

__attribute__((noinline)) static void churn(uint64_t seed) {
    void** live = calloc((size_t)live_set, sizeof(void*));
    uint64_t state = seed | 1;
    for (long i = 0; i < events_per_thread / 2; ++i) {
        uint64_t r = next_random(&state);
        long slot = (long)(r % (uint64_t)live_set);
        free(live[slot]);
        live[slot] = malloc(16 + (r >> 32) % 4096);
        ((volatile char*)live[slot])[0] = 1;
    }
    for (long i = 0; i < live_set; ++i) free(live[i]);
    free(live);
}

__attribute__((noinline)) static void descend(int level, uint64_t seed) {
    if (level <= 0) {
        churn(seed);
    } else {
        descend(level - 1, seed + 1);
    }
    __asm__ volatile("" ::: "memory"); /* keep the frame: no tail call */
}

static void* thread_main(void* arg) {
    descend(depth, (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull);
    return NULL;
}

int main(int argc, char** argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (argc > 2) events_per_thread = atol(argv[2]);
    if (argc > 3) depth = atoi(argv[3]);
    if (argc > 4) live_set = atol(argv[4]);
    if (threads < 1 || live_set < 1 || depth < 0) return 2;
    if (getenv("ALLOC_BENCH_GATE")) {
        char go;
        if (read(0, &go, 1) != 1) return 2;
    }
    pthread_t* ids = calloc((size_t)threads, sizeof(pthread_t));
    for (int i = 0; i < threads; ++i) pthread_create(&ids[i], NULL, thread_main, (void*)(uintptr_t)(i + 1));
    for (int i = 0; i < threads; ++i) pthread_join(ids[i], NULL);
    free(ids);
    return 0;
}
