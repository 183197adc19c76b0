/* warmup — a server's life in commands: a cache that fills while it warms
 * up, then a leak per request; and steps of growth for threshold rules.
 * Driven line by line on stdin, each command answered with one line on
 * stdout once it is done, so a test can pause, resume and snapshot the
 * process between two commands (nothing allocates while it waits).
 * Only read(2)/write(2) are used for I/O: stdio would allocate its buffers.
 *
 *   (at start)  -> "ready pid=<pid>"
 *   fill        -> "filled": cache_fill     600 x malloc(200), kept
 *                            warm_scratch   100 x malloc(3000), kept until trim
 *                            warm_churn    1000 x (malloc(48), free)
 *   trim        -> "trimmed": the 100 warm_scratch blocks freed
 *   leak        -> "leaked":  leak_request  300 x malloc(100), kept
 *   grow        -> "grown":   grow_step       1 x malloc(1310720), kept (at most 64)
 *   touch N     -> "touched": rss_touch       N x calloc(1, 1 MiB), every byte written, kept (N <= 256)
 *   mark LABEL  -> "marked LABEL <r>" (r = heapsnap_marker(LABEL))
 *   quit / EOF  -> "bye", exit 0
 *   other       -> "unknown command"
 * Each allocation line carries an @site:NAME comment.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

/* Bounds the compiler cannot see: each site below is exactly one stack. */
static volatile int n_cache = 600, n_scratch = 100, n_churn = 1000, n_leak = 300;

static void* volatile cache[600];
static void* volatile scratch[100];
static void* volatile leaked[300 * 64];
static void* volatile steps[64];
static void* volatile touched[256];
static void* volatile churn_block;
static int n_leaked, n_steps, n_touched;

__attribute__((noinline)) void cache_fill(void) {
    for (int i = 0; i < n_cache; ++i) cache[i] = malloc(200); /* @site:cache_fill */
}

__attribute__((noinline)) void warm_scratch(void) {
    for (int i = 0; i < n_scratch; ++i) scratch[i] = malloc(3000); /* @site:warm_scratch */
}

__attribute__((noinline)) void warm_churn(void) {
    for (int i = 0; i < n_churn; ++i) {
        churn_block = malloc(48); /* @site:warm_churn */
        free(churn_block);
    }
}

__attribute__((noinline)) void trim(void) {
    for (int i = 0; i < n_scratch; ++i) free(scratch[i]);
}

__attribute__((noinline)) void leak_request(void) {
    for (int i = 0; i < n_leak && n_leaked < 300 * 64; ++i) leaked[n_leaked++] = malloc(100); /* @site:leak_request */
}

__attribute__((noinline)) void grow_step(void) {
    if (n_steps < 64) steps[n_steps++] = malloc(1310720); /* @site:grow_step */
}

__attribute__((noinline)) void rss_touch(int mib) {
    for (int i = 0; i < mib && n_touched < 256; ++i) {
        char* p = calloc(1, 1 << 20); /* @site:rss_touch */
        if (!p) exit(5);
        memset(p, 1, 1 << 20);
        touched[n_touched++] = p;
    }
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

int main(void) {
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    say("ready pid=", pid, "");
    char line[512];
    while (read_line(line, sizeof line)) {
        if (strcmp(line, "fill") == 0) {
            cache_fill();
            warm_scratch();
            warm_churn();
            say("filled", "", "");
        } else if (strcmp(line, "trim") == 0) {
            trim();
            say("trimmed", "", "");
        } else if (strcmp(line, "leak") == 0) {
            leak_request();
            say("leaked", "", "");
        } else if (strcmp(line, "grow") == 0) {
            grow_step();
            say("grown", "", "");
        } else if (strncmp(line, "touch ", 6) == 0) {
            rss_touch(atoi(line + 6));
            say("touched", "", "");
        } else if (strncmp(line, "mark ", 5) == 0) {
            char index[32];
            snprintf(index, sizeof index, " %d", heapsnap_marker(line + 5));
            say("marked ", line + 5, index);
        } else if (strcmp(line, "quit") == 0) {
            break;
        } else {
            say("unknown command", "", "");
        }
    }
    say("bye", "", "");
    return 0;
}
