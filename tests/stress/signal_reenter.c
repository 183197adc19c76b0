/* signal_reenter — a signal handler that maps, unmaps and allocates while
 * its thread is inside the recorder's malloc, mmap and munmap hooks, at
 * known points: the program's allocator (hostile_alloc.c, which the hooks
 * call as the real one) raises SIGUSR1 after every third malloc, mmap and
 * munmap it makes. Inside the malloc hook the handler runs while the
 * recorder counts its thread as inside the allocator, whose own mappings
 * are not the program's: the handler's are, and are recorded.
 *
 * main: ROUNDS times, maps and unmaps 3 pages and mallocs and frees 32
 * bytes. The handler maps and unmaps 5 pages, mallocs and frees 48 bytes,
 * and every KEEP_EVERY-th signal keeps a mapping of 7 pages
 * (handler_map_keep) and malloc(555) (handler_keep).
 *
 * Signals: 300 mallocs, 300 maps, 300 unmaps by main, a third of each:
 * 300. Live at "done" and at exit, from the handler: 30 mappings of 7
 * pages (860 160 bytes), the program's only anonymous mappings, and 30
 * blocks of 555 bytes (16 650 bytes).
 * Output: "signal_reenter: 300 signals, 30 kept". Exit status 0.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <heapsnap/heapsnap.h>

#include "hostile_alloc.h"

enum { ROUNDS = 300, KEEP_EVERY = 10, PAGE = 4096, MAX_KEPT = 64 };

static volatile int handled;
static void* kept_maps[MAX_KEPT];
static void* kept_blocks[MAX_KEPT];
static volatile int kept_count;

__attribute__((noinline)) void* handler_map_keep(void) {
    return mmap(NULL, 7 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* @site:handler_map_keep */
}

__attribute__((noinline)) void* handler_keep(void) {
    return malloc(555); /* @site:handler_keep */
}

static void on_usr1(int sig) {
    (void)sig;
    /* The recorder's mmap and munmap hooks block signals: a signal raised
     * inside them is handled as they return, after hostile_alloc's raise()
     * returned. The handler's own calls raise nothing either way. */
    int raising = hostile_raising;
    hostile_raising = 1;
    void* m = mmap(NULL, 5 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m != MAP_FAILED) munmap(m, 5 * PAGE);
    void* volatile p = malloc(48);
    free(p);
    handled++;
    if (handled % KEEP_EVERY == 0 && kept_count < MAX_KEPT) {
        kept_maps[kept_count] = handler_map_keep();
        kept_blocks[kept_count] = handler_keep();
        kept_count++;
    }
    hostile_raising = raising;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0) return 2;
    hostile_every = 3;
    hostile_signal = SIGUSR1;
    for (int i = 0; i < ROUNDS; ++i) {
        void* m = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return 3;
        munmap(m, 3 * PAGE);
        void* volatile p = malloc(32);
        free(p);
    }
    hostile_signal = 0;
    for (int i = 0; i < kept_count; ++i)
        if (kept_maps[i] == MAP_FAILED || !kept_blocks[i]) return 4;
    heapsnap_marker("done");
    printf("signal_reenter: %d signals, %d kept\n", handled, kept_count);
    return 0;
}
