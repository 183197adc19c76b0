/* thread_turnover — a long run of short-lived threads, at most WINDOW
 * alive at a time, as a server that starts a thread per request: whatever
 * the recorder keeps per thread must be given back when the thread exits,
 * or its memory grows with every thread ever created.
 *
 * Usage: stress_thread_turnover [TOTAL]   (default 100000)
 * Threads 0..TOTAL-1 are created in order; thread n is joined before
 * thread n + WINDOW is created. Thread n: 10 x (malloc(32 + n % 64), free);
 * thread n with n % KEEP_EVERY == 0 also calls turnover_keep(), which keeps
 * malloc(KEEP_BYTES) until exit.
 *
 * After FIRST threads have been joined and again after all of them, it
 * prints its resident memory (VmRSS of /proc/self/status, read without
 * malloc) and takes a marker ("first", "last"):
 *   "after 100 threads: VmRSS N kB", "after 100000 threads: VmRSS N kB".
 * Then "thread_turnover: 100000 threads, 100 blocks kept". Exit status 0.
 *
 * Live from turnover_keep() from "started" to "last" and at exit:
 *   TOTAL / KEEP_EVERY blocks of KEEP_BYTES (100 x 120 = 12000 bytes).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

enum { WINDOW = 8, FIRST = 100, KEEP_EVERY = 1000, KEEP_BYTES = 120 };

static void** kept;

__attribute__((noinline)) void* turnover_keep(void) {
    return malloc(KEEP_BYTES); /* @site:turnover_keep */
}

static void* short_life(void* arg) {
    uintptr_t n = (uintptr_t)arg;
    for (int i = 0; i < 10; ++i) {
        void* volatile p = malloc(32 + n % 64);
        free(p);
    }
    if (n % KEEP_EVERY == 0) kept[n / KEEP_EVERY] = turnover_keep();
    return NULL;
}

/* VmRSS in kB, or 0 if it cannot be read. */
static unsigned long vm_rss_kb(void) {
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char* line = strstr(buf, "\nVmRSS:");
    return line ? strtoul(line + 7, NULL, 10) : 0;
}

static void checkpoint(unsigned long threads, const char* label) {
    printf("after %lu threads: VmRSS %lu kB\n", threads, vm_rss_kb());
    fflush(stdout);
    heapsnap_marker(label);
}

int main(int argc, char** argv) {
    unsigned long total = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
    if (total < FIRST) return 2;
    kept = calloc(total / KEEP_EVERY + 1, sizeof *kept);
    if (!kept) return 2;
    heapsnap_marker("started");
    pthread_t window[WINDOW];
    for (unsigned long n = 0; n < total + WINDOW; ++n) {
        if (n >= WINDOW) {
            if (pthread_join(window[n % WINDOW], NULL) != 0) return 3;
            if (n - WINDOW + 1 == FIRST) checkpoint(FIRST, "first");
        }
        if (n < total && pthread_create(&window[n % WINDOW], NULL, short_life, (void*)(uintptr_t)n) != 0) return 2;
    }
    checkpoint(total, "last");
    unsigned long blocks = 0;
    for (unsigned long i = 0; i <= total / KEEP_EVERY; ++i) blocks += kept[i] != NULL;
    printf("thread_turnover: %lu threads, %lu blocks kept\n", total, blocks);
    return 0;
}
