/* line_trip — how far apart two CPUs are, for tools/bench's last line.
 *
 * Two threads, pinned to CPU 0 and CPU 1, hand one cache line back and
 * forth ROUNDS times (each waits for the other's store, then stores);
 * prints the mean round trip in nanoseconds. The recorder's rings are
 * written on the program's CPU and read on the writer's, so what a line
 * costs to move between them is part of the recording overhead. On the
 * development VM (2026-11-27) it read 450 to 520 ns in some hours and 170
 * to 200 in others (docs/bench-history.md, "From 9a6a52f to 8235870").
 *
 * Usage: line_trip [ROUNDS]. Exit status 0; 1 with a message on stderr if
 * there is no CPU 1 to pin to.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(64) _Atomic long g_turn;
static long g_rounds = 200000;

static int pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof set, &set);
}

static void *answer(void *unused) {
    pin(1);
    for (long i = 0; i < g_rounds; ++i) {
        while (atomic_load_explicit(&g_turn, memory_order_acquire) != 2 * i + 1) {
        }
        atomic_store_explicit(&g_turn, 2 * i + 2, memory_order_release);
    }
    return unused;
}

int main(int argc, char **argv) {
    if (argc > 1) g_rounds = atol(argv[1]);
    if (pin(1) != 0) {
        fprintf(stderr, "line_trip: no CPU 1 to pin to\n");
        return 1;
    }
    if (pin(0) != 0) {
        fprintf(stderr, "line_trip: cannot run on CPU 0\n");
        return 1;
    }
    pthread_t peer;
    pthread_create(&peer, NULL, answer, NULL);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (long i = 0; i < g_rounds; ++i) {
        atomic_store_explicit(&g_turn, 2 * i + 1, memory_order_release);
        while (atomic_load_explicit(&g_turn, memory_order_acquire) != 2 * i + 2) {
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    pthread_join(peer, NULL);
    double ns = (double)(end.tv_sec - start.tv_sec) * 1e9 + (double)(end.tv_nsec - start.tv_nsec);
    printf("%.0f\n", ns / (double)g_rounds);
    return 0;
}
