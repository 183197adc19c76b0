/* signal_jump — signal handlers that leave the recorder's hooks by
 * siglongjmp, after which the program goes on allocating and mapping.
 *
 * 1. From the malloc hook, at a known point: the program's allocator
 *    (hostile_alloc.c, the hooks' real malloc) raises SIGUSR1 after it
 *    made the block, and the handler jumps back to main. The block is
 *    never returned: the program leaks it, recorded or not, and the
 *    recorder counts it as unrecorded. JUMPS times (64 bytes each).
 * 2. From the mmap hook, at a known point: the allocator's mmap raises
 *    SIGUSR1 after it made the mapping. The mapping (5 pages) is never
 *    returned either, but the recorder records it before the handler
 *    runs (its mmap hook blocks signals): JUMPS mappings stay live.
 * 3. From anywhere in a loop of mmap and munmap of 3 read-only pages: a
 *    timer sends SIGALRM every 100 µs and the handler jumps back to the
 *    loop, TIMER_JUMPS times. A jump that left an mmap after it made its
 *    mapping, or a munmap before it unmapped, leaves a mapping behind. The
 *    program counts those (anonymous r--p mappings in /proc/self/maps,
 *    which nothing else makes) and takes a marker labelled
 *    "left=<bytes>": the log's live mappings at that marker are exactly
 *    the part 2 mappings and those bytes. Then it unmaps them.
 * 4. Then, with no signal: keep_block() keeps 40 blocks of 300 bytes and
 *    keep_map() 10 mappings of 9 pages, and main frees and unmaps
 *    everything else it made.
 *
 * Live at "done" and at exit: 40 blocks of 300 bytes from keep_block()
 * (12 000 bytes), 10 mappings of 9 pages (368 640 bytes) from keep_map();
 * and the JUMPS blocks part 1 leaked, which the log does not have: its
 * markers count JUMPS unrecorded events. Output:
 * "signal_jump: 50 + 50 + 200 jumps". Exit status 0.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>

#include <heapsnap/heapsnap.h>

#include "hostile_alloc.h"

enum { JUMPS = 50, TIMER_JUMPS = 200, KEEP_BLOCKS = 40, KEEP_MAPS = 10, PAGE = 4096 };

static sigjmp_buf back;
static volatile int armed;

static void jump_back(int sig) {
    (void)sig;
    if (armed) siglongjmp(back, 1);
}

__attribute__((noinline)) void* keep_block(void) {
    return malloc(300); /* @site:keep_block */
}

__attribute__((noinline)) void* keep_map(void) {
    return mmap(NULL, 9 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* @site:keep_map */
}

/* Bytes of anonymous read-only private mappings. */
static long left_behind(void) {
    FILE* maps = fopen("/proc/self/maps", "r");
    if (!maps) return -1;
    char line[512];
    long bytes = 0;
    while (fgets(line, sizeof line, maps)) {
        unsigned long lo, hi, offset, inode;
        char perms[8], dev[16];
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &lo, &hi, perms, &offset, dev, &inode, &path_at) < 6) continue;
        if (strcmp(perms, "r--p") == 0 && inode == 0 && (line[path_at] == '\0' || line[path_at] == '\n')) bytes += (long)(hi - lo);
    }
    fclose(maps);
    return bytes;
}

static int unmap_left_behind(void) {
    FILE* maps = fopen("/proc/self/maps", "r");
    if (!maps) return -1;
    char line[512];
    unsigned long ranges[2 * TIMER_JUMPS];
    int n = 0;
    while (fgets(line, sizeof line, maps) && n < TIMER_JUMPS) {
        unsigned long lo, hi, offset, inode;
        char perms[8], dev[16];
        int path_at = 0;
        if (sscanf(line, "%lx-%lx %7s %lx %15s %lu %n", &lo, &hi, perms, &offset, dev, &inode, &path_at) < 6) continue;
        if (strcmp(perms, "r--p") == 0 && inode == 0 && (line[path_at] == '\0' || line[path_at] == '\n')) {
            ranges[2 * n] = lo;
            ranges[2 * n + 1] = hi;
            n++;
        }
    }
    fclose(maps);
    for (int i = 0; i < n; ++i) munmap((void*)ranges[2 * i], ranges[2 * i + 1] - ranges[2 * i]);
    return n;
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = jump_back;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0 || sigaction(SIGALRM, &sa, NULL) != 0) return 2;

    /* 1 */
    static volatile int jumped;
    hostile_every = 1;
    armed = 1;
    hostile_signal = SIGUSR1;
    jumped = 0;
    sigsetjmp(back, 1);
    hostile_raising = 0;
    if (jumped < JUMPS) {
        jumped++;
        void* volatile p = malloc(64);
        (void)p;
        return 5; /* the handler always jumps */
    }
    /* 2 */
    jumped = 0;
    sigsetjmp(back, 1);
    hostile_raising = 0;
    if (jumped < JUMPS) {
        jumped++;
        void* volatile m = mmap(NULL, 5 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        (void)m;
        return 6;
    }
    hostile_signal = 0;
    /* 3 */
    jumped = 0;
    struct itimerval every = {{0, 100}, {0, 100}};
    if (setitimer(ITIMER_REAL, &every, NULL) != 0) return 2;
    sigsetjmp(back, 1);
    if (jumped < TIMER_JUMPS) {
        jumped++;
        for (;;) {
            void* m = mmap(NULL, 3 * PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m == MAP_FAILED) return 3;
            munmap(m, 3 * PAGE);
        }
    }
    armed = 0;
    struct itimerval off;
    memset(&off, 0, sizeof off);
    setitimer(ITIMER_REAL, &off, NULL);
    char label[64];
    snprintf(label, sizeof label, "left=%ld", left_behind());
    heapsnap_marker(label);
    if (unmap_left_behind() < 0) return 4;
    /* 4 */
    hostile_mask = 1;
    jumped = 0;
    armed = 1;
    if (setitimer(ITIMER_REAL, &every, NULL) != 0) return 2;
    sigsetjmp(back, 1);
    if (jumped < TIMER_JUMPS) {
        jumped++;
        for (;;) {
            void* p = malloc(32);
            p = realloc(p, 96);
            free(p);
        }
    }
    armed = 0;
    setitimer(ITIMER_REAL, &off, NULL);
    hostile_mask = 0;
    heapsnap_marker("jumped");
    /* 5 */
    void* blocks[KEEP_BLOCKS];
    void* maps[KEEP_MAPS];
    for (int i = 0; i < KEEP_BLOCKS; ++i) blocks[i] = keep_block();
    for (int i = 0; i < KEEP_MAPS; ++i) maps[i] = keep_map();
    for (int i = 0; i < KEEP_BLOCKS; ++i)
        if (!blocks[i]) return 4;
    for (int i = 0; i < KEEP_MAPS; ++i)
        if (maps[i] == MAP_FAILED) return 4;
    heapsnap_marker("done");
    printf("signal_jump: %d + %d + %d + %d jumps\n", JUMPS, JUMPS, TIMER_JUMPS, TIMER_JUMPS);
    return 0;
}
