/* growth — the A/B program: a baseline phase, then a growth phase with one
 * call site per allocation function, so `heapsnap diff` between the two
 * moments has an exact, known answer.
 *
 * Usage:
 *   growth --auto    phase1, marker "A", phase2, marker "B", exit 0
 *   growth           commands on stdin, one per line; each answered with one
 *                    line on stdout once it is done:
 *                      (at start)  -> "ready pid=<pid>"
 *                      phase1      -> "phase1 done"
 *                      phase2      -> "phase2 done"
 *                      mark LABEL  -> "marked LABEL <r>"  (r = heapsnap_marker(LABEL):
 *                                     1 recorded, 0 not recorded)
 *                      churn N     -> "churned N": N x (malloc(64), free) at
 *                                     the churn site, which nets nothing
 *                      quit / EOF  -> "bye", exit 0
 *                      other       -> "unknown command"
 *                    A test can take `heapsnap snapshot PID` between the
 *                    answers: nothing allocates while the program waits.
 * Only read(2)/write(2) are used for I/O: stdio would allocate its buffers.
 *
 * Phase 1 (baseline):
 *   baseline_keep   10 x malloc(1000)          live in A and B: no delta
 *   baseline_drop    5 x malloc(2048)          freed in phase 2
 *   realloc_seed     1 x malloc(100)           grown by realloc in phase 2
 * Phase 2 (growth), expected diff A -> B per call site (group by stack):
 *   leak_malloc      7 x malloc(1234)          +8638 bytes  +7 blocks
 *   leak_calloc      4 x calloc(3, 333)        +3996        +4
 *   leak_memalign    2 x posix_memalign(64, 4096)
 *                                              +8192        +2
 *   realloc_grow     realloc(seed, 5000)       +5000        +1
 *   realloc_seed     (its block released by the realloc)
 *                                               -100        -1
 *   inline_leak      3 x malloc(777) in leak_inline(), always inlined into
 *                    leak_inline_caller() at its call (site "inline_call")
 *                                              +2331        +3
 *   churn            1000 x (malloc(64), free) no entry
 *   baseline_drop    the 5 phase-1 blocks freed
 *                                             -10240        -5
 *   total                                     +17817 bytes +11 blocks
 * Each allocation line carries an @site:NAME comment; the tests find line
 * numbers by searching for it.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

/* Loop bounds the compiler cannot see, so no loop is unrolled into several
 * call sites: each site below is exactly one stack. */
static volatile int n_keep = 10, n_drop = 5, n_leak = 7, n_calloc = 4, n_memalign = 2, n_inline = 3,
                    n_churn = 1000;

static void* volatile keep_blocks[10];
static void* volatile drop_blocks[5];
static void* volatile grow_block;
static void* volatile leak_blocks[7];
static void* volatile calloc_blocks[4];
static void* volatile memalign_blocks[2];
static void* volatile inline_blocks[3];
static void* volatile churn_block;

__attribute__((noinline)) void baseline_keep(void) {
    for (int i = 0; i < n_keep; ++i) keep_blocks[i] = malloc(1000); /* @site:baseline_keep */
}

__attribute__((noinline)) void baseline_drop(void) {
    for (int i = 0; i < n_drop; ++i) drop_blocks[i] = malloc(2048); /* @site:baseline_drop */
}

__attribute__((noinline)) void realloc_seed(void) {
    grow_block = malloc(100); /* @site:realloc_seed */
}

__attribute__((noinline)) void leak_malloc(void) {
    for (int i = 0; i < n_leak; ++i) leak_blocks[i] = malloc(1234); /* @site:leak_malloc */
}

__attribute__((noinline)) void leak_calloc(void) {
    for (int i = 0; i < n_calloc; ++i) calloc_blocks[i] = calloc(3, 333); /* @site:leak_calloc */
}

__attribute__((noinline)) void leak_memalign(void) {
    for (int i = 0; i < n_memalign; ++i) {
        void* p = NULL;
        if (posix_memalign(&p, 64, 4096) != 0) abort(); /* @site:leak_memalign */
        memalign_blocks[i] = p;
    }
}

__attribute__((noinline)) void realloc_grow(void) {
    grow_block = realloc(grow_block, 5000); /* @site:realloc_grow */
}

static inline __attribute__((always_inline)) void* leak_inline(size_t size) {
    return malloc(size); /* @site:inline_leak */
}

__attribute__((noinline)) void leak_inline_caller(void) {
    for (int i = 0; i < n_inline; ++i) inline_blocks[i] = leak_inline(777); /* @site:inline_call */
}

__attribute__((noinline)) void churn(void) {
    for (int i = 0; i < n_churn; ++i) {
        churn_block = malloc(64); /* @site:churn */
        free(churn_block);
    }
}

__attribute__((noinline)) void drop_baseline(void) {
    for (int i = 0; i < n_drop; ++i) free(drop_blocks[i]);
}

static void phase1(void) {
    baseline_keep();
    baseline_drop();
    realloc_seed();
}

static void phase2(void) {
    leak_malloc();
    leak_calloc();
    leak_memalign();
    realloc_grow();
    leak_inline_caller();
    churn();
    drop_baseline();
}

static void say(const char* a, const char* b, const char* c) {
    char line[600];
    int n = snprintf(line, sizeof line, "%s%s%s\n", a, b, c);
    if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
    for (int done = 0; done < n;) {
        ssize_t w = write(STDOUT_FILENO, line + done, (size_t)(n - done));
        if (w <= 0) exit(4);
        done += (int)w;
    }
}

/* Reads one line into buf without its newline; false at end of input. */
static int read_line(char* buf, size_t cap) {
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(STDIN_FILENO, &c, 1);
        if (r <= 0) {
            buf[n] = 0;
            return n > 0;
        }
        if (c == '\n') break;
        if (n + 1 < cap) buf[n++] = c;
    }
    buf[n] = 0;
    return 1;
}

static int interactive(void) {
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    say("ready pid=", pid, "");
    char line[512];
    while (read_line(line, sizeof line)) {
        if (strcmp(line, "phase1") == 0) {
            phase1();
            say("phase1 done", "", "");
        } else if (strcmp(line, "phase2") == 0) {
            phase2();
            say("phase2 done", "", "");
        } else if (strncmp(line, "mark ", 5) == 0) {
            char index[32];
            snprintf(index, sizeof index, " %d", heapsnap_marker(line + 5));
            say("marked ", line + 5, index);
        } else if (strncmp(line, "churn ", 6) == 0) {
            int times = atoi(line + 6), saved = n_churn;
            n_churn = times;
            churn();
            n_churn = saved;
            say("churned ", line + 6, "");
        } else if (strcmp(line, "quit") == 0) {
            break;
        } else {
            say("unknown command", "", "");
        }
    }
    say("bye", "", "");
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--auto") == 0) {
        phase1();
        heapsnap_marker("A");
        phase2();
        heapsnap_marker("B");
        return 0;
    }
    return interactive();
}
