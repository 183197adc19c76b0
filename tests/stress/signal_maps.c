/* signal_maps — mmap, munmap and malloc from a signal handler while the
 * interrupted thread maps, unmaps and allocates itself: the timer's
 * SIGALRM lands anywhere, including in the recorder's mmap, munmap and
 * malloc hooks on the main thread.
 *
 * An interval timer sends SIGALRM every 100 µs; main maps and unmaps 3
 * pages and mallocs and frees 32 bytes in a loop until SIGNALS signals
 * were handled. The handler maps and unmaps 5 pages and mallocs and frees
 * 48 bytes, and every KEEP_EVERY-th signal calls handler_map_keep(), which
 * keeps a mapping of 7 pages, and handler_keep(), which keeps malloc(555).
 * The handler disarms the timer at the last signal.
 *
 * Live at "done" and at exit, from the handler: SIGNALS / KEEP_EVERY = 20
 * mappings of 7 pages (573 440 bytes), the program's only anonymous
 * mappings, and 20 blocks of 555 bytes (11 100 bytes) from handler_keep().
 * Output: "signal_maps: 2000 signals, 20 kept". Exit status 0.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

enum { SIGNALS = 2000, KEEP_EVERY = 100, PAGE = 4096 };

static volatile sig_atomic_t handled;
static void* kept_maps[SIGNALS / KEEP_EVERY];
static void* kept_blocks[SIGNALS / KEEP_EVERY];
static volatile int kept_count;

__attribute__((noinline)) void* handler_map_keep(void) {
    return mmap(NULL, 7 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* @site:handler_map_keep */
}

__attribute__((noinline)) void* handler_keep(void) {
    return malloc(555); /* @site:handler_keep */
}

static void on_alarm(int sig) {
    (void)sig;
    if (handled >= SIGNALS) return;
    void* m = mmap(NULL, 5 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) munmap(m, 5 * PAGE);
    void* volatile p = malloc(48);
    free(p);
    handled++;
    if (handled % KEEP_EVERY == 0) {
        kept_maps[kept_count] = handler_map_keep();
        kept_blocks[kept_count] = handler_keep();
        kept_count++;
    }
    if (handled == SIGNALS) {
        struct itimerval off;
        memset(&off, 0, sizeof off);
        setitimer(ITIMER_REAL, &off, NULL);
    }
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGALRM, &sa, NULL) != 0) return 2;
    /* Warm both tcache bins up before the first signal. */
    void* volatile warm = malloc(48);
    free(warm);
    warm = malloc(32);
    free(warm);
    struct itimerval every = {{0, 100}, {0, 100}};
    if (setitimer(ITIMER_REAL, &every, NULL) != 0) return 2;
    while (handled < SIGNALS) {
        void* m = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 3;
        munmap(m, 3 * PAGE);
        void* volatile p = malloc(32);
        free(p);
    }
    for (int i = 0; i < kept_count; ++i)
        if (kept_maps[i] == MAP_FAILED || !kept_blocks[i]) return 4;
    heapsnap_marker("done");
    printf("signal_maps: %d signals, %d kept\n", (int)handled, kept_count);
    return 0;
}
