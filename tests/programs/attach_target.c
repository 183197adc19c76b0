/* attach_target — a program started without heapsnap, for `heapsnap
 * attach`: it allocates before anyone attaches, then on command.
 *
 * Usage: attach_target   commands on stdin, one per line, each answered
 *                        with one line on stdout once done:
 *   (at start)    -> "ready pid=<pid>"   after before_attach
 *   grow          -> "grown"             attach_grow, attach_calloc
 *   free-before   -> "freed 7 usable U"  the before_attach blocks freed;
 *                                        U: their malloc_usable_size, summed
 *   threads N     -> "started N"         N threads allocate and free as
 *                                        fast as they can until `stop`
 *   stop          -> "stopped <n>"       n: 1 if every thread ran
 *   hold-arena    -> "holding"           a thread fills stderr (a pipe
 *                                        nobody reads yet), then calls
 *                                        malloc_stats(), which writes to
 *                                        stderr with the main arena's lock
 *                                        held: it stays held until the
 *                                        pipe is read
 *   join-arena    -> "joined"            that thread joined
 *   quit / EOF    -> "bye", exit status 3
 * Only read(2)/write(2) for I/O: stdio would allocate.
 *
 *   before_attach   7 x malloc(100)      live before recording begins
 *   attach_grow     9 x malloc(1500)     +13500 bytes +9 blocks
 *   attach_calloc   3 x calloc(4, 250)   +3000 bytes  +3 blocks
 *
 * main keeps malloc's and free's addresses (taken_malloc, taken_free):
 * built as a non-PIE executable (attach_target_nopie), that makes the
 * linker export both as undefined symbols whose value is the program's
 * own PLT entry, as in Debian's python3 (src/recorder/definitions.h).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile int n_before = 7, n_grow = 9, n_calloc = 3;
static void* volatile before_blocks[7];
static void* volatile grow_blocks[9];
static void* volatile calloc_blocks[3];

enum { kMaxThreads = 64 };
static pthread_t threads[kMaxThreads];
static int n_threads = 0;
static volatile int running = 0;
static volatile unsigned long rounds[kMaxThreads];

__attribute__((noinline)) void before_attach(void) {
    for (int i = 0; i < n_before; ++i) before_blocks[i] = malloc(100); /* @site:before_attach */
}

__attribute__((noinline)) void attach_grow(void) {
    for (int i = 0; i < n_grow; ++i) grow_blocks[i] = malloc(1500); /* @site:attach_grow */
}

__attribute__((noinline)) void attach_calloc(void) {
    for (int i = 0; i < n_calloc; ++i) calloc_blocks[i] = calloc(4, 250); /* @site:attach_calloc */
}

/* Returns the blocks' usable size, summed. */
__attribute__((noinline)) long free_before(void) {
    long usable = 0;
    for (int i = 0; i < n_before; ++i) {
        usable += (long)malloc_usable_size(before_blocks[i]);
        free(before_blocks[i]);
    }
    return usable;
}

void* (*volatile taken_malloc)(size_t);
void (*volatile taken_free)(void*);

/* Allocates and frees as fast as it can: a few live blocks of varying
 * sizes, each freed and replaced in turn. */
static void* churn(void* arg) {
    long index = (long)arg;
    void* live[8] = {0};
    unsigned long n = 0;
    while (running) {
        unsigned slot = n % 8;
        free(live[slot]);
        live[slot] = malloc(16 + (n * 37) % 4000); /* @site:churn */
        ++n;
    }
    for (int i = 0; i < 8; ++i) free(live[i]);
    rounds[index] = n;
    return NULL;
}

static pthread_t arena_holder;
static int holder_ready[2];

/* Fills stderr until a write would block, then holds the main arena's
 * lock in malloc_stats() until stderr is read. */
static void* hold_arena(void* arg) {
    (void)arg;
    int flags = fcntl(2, F_GETFL);
    fcntl(2, F_SETFL, flags | O_NONBLOCK);
    static const char fill[4096] = {'x'};
    while (write(2, fill, sizeof fill) > 0) {
    }
    fcntl(2, F_SETFL, flags);
    char go = 1;
    write(holder_ready[1], &go, 1);
    malloc_stats();
    return NULL;
}

static void say(const char* s) {
    size_t n = strlen(s);
    while (n) {
        ssize_t w = write(1, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void say_number(const char* head, long v) {
    char text[96];
    char digits[24];
    int k = 0;
    do digits[k++] = (char)('0' + v % 10);
    while (v /= 10);
    size_t n = strlen(head);
    memcpy(text, head, n);
    while (k) text[n++] = digits[--k];
    text[n++] = '\n';
    text[n] = 0;
    say(text);
}

/* One line of stdin into `line`; 0 at EOF. */
static int read_line(char* line, size_t cap) {
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(0, &c, 1);
        if (r <= 0) return n > 0;
        if (c == '\n') break;
        if (n + 1 < cap) line[n++] = c;
    }
    line[n] = 0;
    return 1;
}

int main(void) {
    taken_malloc = malloc;
    taken_free = free;
    before_attach();
    say_number("ready pid=", (long)getpid());
    char line[128];
    while (read_line(line, sizeof line)) {
        if (strcmp(line, "grow") == 0) {
            attach_grow();
            attach_calloc();
            say("grown\n");
        } else if (strcmp(line, "free-before") == 0) {
            say_number("freed 7 usable ", free_before());
        } else if (strncmp(line, "threads ", 8) == 0) {
            int n = atoi(line + 8);
            if (n > kMaxThreads) n = kMaxThreads;
            running = 1;
            for (n_threads = 0; n_threads < n; ++n_threads)
                pthread_create(&threads[n_threads], NULL, churn, (void*)(long)n_threads);
            say_number("started ", n);
        } else if (strcmp(line, "stop") == 0) {
            running = 0;
            int all = 1;
            for (int i = 0; i < n_threads; ++i) {
                pthread_join(threads[i], NULL);
                if (!rounds[i]) all = 0;
            }
            n_threads = 0;
            say_number("stopped ", all);
        } else if (strcmp(line, "hold-arena") == 0) {
            char go;
            pipe(holder_ready);
            pthread_create(&arena_holder, NULL, hold_arena, NULL);
            read(holder_ready[0], &go, 1);
            close(holder_ready[0]);
            close(holder_ready[1]);
            say("holding\n");
        } else if (strcmp(line, "join-arena") == 0) {
            pthread_join(arena_holder, NULL);
            say("joined\n");
        } else if (strcmp(line, "quit") == 0) {
            break;
        } else {
            say("unknown command\n");
        }
    }
    say("bye\n");
    return 3;
}
