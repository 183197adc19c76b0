/* unwind_shapes — allocates from call paths of every shape an unwinder
 * meets and prints, for each distinct path, what it allocated, so a test
 * can compare every stack heapsnap recorded with the path the program
 * really took (tests/integration/test_unwind.py).
 *
 * Usage: unwind_shapes all|fp|thunks
 *   all     every shape below;
 *   fp      only functions with frame pointers and no signal frames: the
 *           paths `--unwind fp` must get right too;
 *   thunks  only 100 rounds of the five frames without CFI below
 *           (step_nocfi, step_nocfi_big, step_jit, step_nocfi_clobber,
 *           step_nocfi_huge), from main, then on threads on glibc's
 *           default stack, on a 1 MiB stack glibc makes and on a 1 MiB
 *           stack of the program's own.
 *
 * Shapes: deep recursion of varying depth through a random mix of frames
 * with and without frame pointers, alloca (variable-size frames), a
 * realigned frame (aligned local plus alloca: GCC's DRAP, whose CFA is an
 * expression), a frame larger than a page, a frame of code without CFI
 * that keeps a frame pointer (assembly thunks in the program, one with a
 * frame of two pages, and a copy of the other in anonymous memory, as a
 * JIT's code is), the same leaf reached from two
 * callers with identical frames at the same depth (alternating in a loop,
 * so a stack cache must notice the changed caller above an unchanged leaf),
 * allocations right after returning from a deeper call (the old stack is
 * still in memory below), a longjmp out of a deep call, a signal handler
 * that allocates (delivered while the program spins in its own code, and
 * from pthread_kill inside libc), and two threads doing all this at once.
 * The sequence is fixed (a seeded generator), so every run takes the same
 * paths.
 *
 * Every allocation is made by leaf_alloc and kept, between the markers
 * "start" and "end". The program tracks the path it is on (each function
 * pushes its name), and prints after "end", one line per distinct path:
 *   BYTES BLOCKS leaf_alloc CALLER ... ROOT
 * innermost first, ROOT being main or worker_main; libc frames (signal
 * trampoline, pthread_kill, thread start) are not part of the path.
 *
 * Built like the other test programs (-O1, frame pointers, no sibling
 * calls); noinline/noclone keep each function its own frame and name.
 */
#define _GNU_SOURCE
#include <alloca.h>
#include <heapsnap/heapsnap.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SHAPE __attribute__((noinline, noclone))
#define NO_FP __attribute__((noinline, noclone, optimize("omit-frame-pointer")))

enum { kMaxPath = 128, kMaxPaths = 4096, kMaxDepth = 14 };

static int fp_only;

/* ---- the path each thread is on ------------------------------------------ */

static __thread const char* path[kMaxPath];
static __thread volatile int path_len;
static __thread uint64_t rng;

static void enter(const char* name) { path[path_len++] = name; }
static void leave(void) { path_len--; }

static uint64_t next_random(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* ---- what was allocated from each path --------------------------------------- */

struct Path {
    const char* names[kMaxPath];
    int len;
    unsigned long bytes;
    unsigned long blocks;
};

static struct Path paths[kMaxPaths];
static int path_count;
static pthread_mutex_t paths_lock = PTHREAD_MUTEX_INITIALIZER;

/* Called with the lock held, or from a signal handler of the main thread
 * while no other thread runs (see signal_site). */
static void account(size_t size) {
    int i = 0;
    for (; i < path_count; ++i)
        if (paths[i].len == path_len && memcmp(paths[i].names, path, sizeof(path[0]) * path_len) == 0) break;
    if (i == path_count) {
        if (path_count == kMaxPaths) _exit(97);
        memcpy(paths[i].names, path, sizeof(path[0]) * path_len);
        paths[i].len = path_len;
        path_count++;
    }
    paths[i].bytes += size;
    paths[i].blocks++;
}

static void* volatile sink;

SHAPE void leaf_alloc(int in_handler) {
    size_t size = 1 + next_random() % 256;
    enter("leaf_alloc");
    if (!in_handler) pthread_mutex_lock(&paths_lock);
    account(size);
    if (!in_handler) pthread_mutex_unlock(&paths_lock);
    sink = malloc(size); /* kept: every block is live at "end" */
    leave();
}

/* ---- shapes ----------------------------------------------------------------------- */

typedef void (*Shape)(int depth);
void descend(int depth);

/* After the deeper call returns, sometimes allocate from here: the new
 * stack is shorter, the old one still lies below it in memory. */
SHAPE void maybe_alloc_after(void) {
    if (next_random() % 4) return;
    enter("maybe_alloc_after");
    leaf_alloc(0);
    leave();
}

SHAPE void step_fp(int depth) {
    enter("step_fp");
    descend(depth);
    maybe_alloc_after();
    leave();
}

NO_FP void step_nofp(int depth) {
    enter("step_nofp");
    descend(depth);
    maybe_alloc_after();
    leave();
}

SHAPE void step_alloca(int depth) {
    enter("step_alloca");
    volatile char* scratch = alloca(16 + next_random() % 512);
    scratch[0] = 1;
    descend(depth);
    maybe_alloc_after();
    leave();
}

SHAPE void step_realign(int depth) {
    enter("step_realign");
    volatile char aligned[64] __attribute__((aligned(64)));
    volatile char* scratch = alloca(16 + next_random() % 256);
    aligned[0] = 1;
    scratch[0] = 1;
    descend(depth);
    scratch[1] = aligned[0];
    maybe_alloc_after();
    leave();
}

NO_FP void step_big_nofp(int depth) {
    enter("step_big_nofp");
    volatile char big[6000];
    big[0] = 1;
    descend(depth);
    big[1] = big[0];
    leave();
}

SHAPE void twin_common(int depth) {
    enter("twin_common");
    descend(depth);
    leave();
}

SHAPE void twin_a(int depth) {
    enter("twin_a");
    twin_common(depth);
    leave();
}

SHAPE void twin_b(int depth) {
    enter("twin_b");
    twin_common(depth);
    leave();
}

/* nocfi_thunk(depth, fn) calls fn(depth) from a frame with a frame pointer
 * and no CFI (no FDE covers it: the assembler makes none without .cfi
 * directives). jit_thunk is a copy of its code in an anonymous executable
 * mapping (main), code no loaded object holds: unwinders meet it there as
 * they meet a JIT's. */
void nocfi_thunk(int depth, Shape fn);
extern const char nocfi_thunk_end[];
__asm__(".text\n"
        ".globl nocfi_thunk\n"
        ".type nocfi_thunk, @function\n"
        "nocfi_thunk:\n"
        "  push %rbp\n"
        "  mov %rsp, %rbp\n"
        "  call *%rsi\n"
        "  pop %rbp\n"
        "  ret\n"
        ".size nocfi_thunk, .-nocfi_thunk\n"
        ".globl nocfi_thunk_end\n"
        "nocfi_thunk_end:\n");

/* The same with 8 KiB of locals: its rbp lies two pages above the sp it
 * calls from. */
void nocfi_big_thunk(int depth, Shape fn);
__asm__(".text\n"
        ".globl nocfi_big_thunk\n"
        ".type nocfi_big_thunk, @function\n"
        "nocfi_big_thunk:\n"
        "  push %rbp\n"
        "  mov %rsp, %rbp\n"
        "  sub $0x2000, %rsp\n"
        "  call *%rsi\n"
        "  leave\n"
        "  ret\n"
        ".size nocfi_big_thunk, .-nocfi_big_thunk\n");

static void (*jit_thunk)(int depth, Shape fn);

static void make_jit_thunk(void) {
    size_t size = (size_t)(nocfi_thunk_end - (const char*)nocfi_thunk);
    void* code = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) _exit(94);
    memcpy(code, (const void*)nocfi_thunk, size);
    if (mprotect(code, 4096, PROT_READ | PROT_EXEC) != 0) _exit(94);
    jit_thunk = (void (*)(int, Shape))code;
}

SHAPE void step_nocfi(int depth) {
    enter("step_nocfi");
    enter("nocfi_thunk");
    nocfi_thunk(depth, descend);
    leave();
    maybe_alloc_after();
    leave();
}

SHAPE void step_nocfi_big(int depth) {
    enter("step_nocfi_big");
    enter("nocfi_big_thunk");
    nocfi_big_thunk(depth, descend);
    leave();
    maybe_alloc_after();
    leave();
}

/* Frames without CFI where libunwind ends the stack (thunks mode only: the
 * stack ends at the thunk, so the path above it is not recorded): one whose
 * rbp holds data (1, below its sp), one whose rbp lies more than 0x4000
 * above its sp (a frame of 20 KiB). */
void nocfi_clobber_thunk(int depth, Shape fn);
void nocfi_huge_thunk(int depth, Shape fn);
__asm__(".text\n"
        ".globl nocfi_clobber_thunk\n"
        ".type nocfi_clobber_thunk, @function\n"
        "nocfi_clobber_thunk:\n"
        "  push %rbp\n"
        "  mov $1, %rbp\n"
        "  call *%rsi\n"
        "  pop %rbp\n"
        "  ret\n"
        ".size nocfi_clobber_thunk, .-nocfi_clobber_thunk\n"
        ".globl nocfi_huge_thunk\n"
        ".type nocfi_huge_thunk, @function\n"
        "nocfi_huge_thunk:\n"
        "  push %rbp\n"
        "  mov %rsp, %rbp\n"
        "  sub $0x5000, %rsp\n"
        "  call *%rsi\n"
        "  leave\n"
        "  ret\n"
        ".size nocfi_huge_thunk, .-nocfi_huge_thunk\n");

SHAPE void step_nocfi_clobber(int depth) {
    enter("step_nocfi_clobber");
    nocfi_clobber_thunk(depth, descend);
    leave();
}

SHAPE void step_nocfi_huge(int depth) {
    enter("step_nocfi_huge");
    nocfi_huge_thunk(depth, descend);
    leave();
}

/* The anonymous code's frame has no function and no module: not a name on
 * the path. */
SHAPE void step_jit(int depth) {
    enter("step_jit");
    jit_thunk(depth, descend);
    maybe_alloc_after();
    leave();
}

static const Shape all_shapes[] = {step_fp, step_nofp, step_alloca, step_realign,   step_big_nofp,
                                   twin_a,  twin_b,    step_nocfi,  step_nocfi_big, step_jit};
static const Shape fp_shapes[] = {step_fp,    step_alloca,    step_realign, twin_a,
                                  twin_b,     step_nocfi,     step_nocfi_big, step_jit};

/* At the bottom the same leaf several times in a row from the same stack. */
SHAPE void descend(int depth) {
    enter("descend");
    if (depth == 0) {
        int repeat = 1 + (int)(next_random() % 3);
        for (int i = 0; i < repeat; ++i) leaf_alloc(0);
    } else if (fp_only) {
        fp_shapes[next_random() % (sizeof fp_shapes / sizeof fp_shapes[0])](depth - 1);
    } else {
        all_shapes[next_random() % (sizeof all_shapes / sizeof all_shapes[0])](depth - 1);
    }
    leave();
}

/* Alternating callers: twin_a and twin_b have the same frame, so the leaf
 * and twin_common are at the same addresses with the same registers each
 * time; only the return address into twin_a/twin_b differs. */
SHAPE void alternate(void) {
    enter("alternate");
    for (int i = 0; i < 200; ++i) (i % 2 ? twin_a : twin_b)(0);
    leave();
}

SHAPE void random_paths(int rounds) {
    enter("random_paths");
    for (int i = 0; i < rounds; ++i) descend(1 + (int)(next_random() % kMaxDepth));
    leave();
}

/* ---- longjmp out of a deep call ------------------------------------------------------ */

static jmp_buf jump_back;

SHAPE void dive(int depth) {
    enter("dive");
    if (depth > 0) {
        dive(depth - 1);
    } else if (depth == 0) {
        leaf_alloc(0);
        longjmp(jump_back, 1);
    }
    leave();
}

SHAPE void jump_site(void) {
    enter("jump_site");
    for (int round = 0; round < 3; ++round) {
        int saved = path_len;
        if (!setjmp(jump_back)) dive(10 + round * 7);
        path_len = saved;
        leaf_alloc(0); /* right after the longjmp: the old frames lie below */
    }
    leave();
}

/* ---- signal handlers that allocate ----------------------------------------------------- */

static volatile sig_atomic_t signalled;

SHAPE void on_signal(int sig) {
    (void)sig;
    enter("on_signal");
    leaf_alloc(1);
    leave();
    signalled = 1;
}

/* Interrupted in program code: the frame below the trampoline is this
 * loop, at whatever instruction the signal found it. */
SHAPE void spin(void) {
    enter("spin");
    while (!signalled) {
    }
    leave();
}

SHAPE void kill_self(void) {
    enter("kill_self");
    pthread_kill(pthread_self(), SIGUSR1);
    leave();
}

SHAPE void signal_site(void) {
    enter("signal_site");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGALRM, &sa, NULL);

    /* A timer aimed at this thread, so no other thread takes the signal. */
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGALRM;
    ev._sigev_un._tid = gettid(); /* sigev_notify_thread_id, which glibc 2.36 lacks */
    timer_t timer;
    if (timer_create(CLOCK_MONOTONIC, &ev, &timer) != 0) _exit(96);
    for (int round = 0; round < 5; ++round) {
        signalled = 0;
        struct itimerspec when = {{0, 0}, {0, 1000000}};
        timer_settime(timer, 0, &when, NULL);
        spin();
    }
    timer_delete(timer);

    signalled = 0;
    kill_self();
    leave();
}

/* ---- threads ----------------------------------------------------------------------------- */

SHAPE void* worker_main(void* arg) {
    rng = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull;
    enter("worker_main");
    random_paths(150);
    alternate();
    leave();
    return NULL;
}

/* ---- thunks mode ------------------------------------------------------------------------ */

SHAPE void thunk_rounds(void) {
    for (int round = 0; round < 100; ++round) {
        step_nocfi(0);
        step_nocfi_big(0);
        step_jit(0);
        step_nocfi_clobber(0);
        step_nocfi_huge(0);
    }
}

SHAPE void* thunk_worker(void* arg) {
    rng = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull;
    enter("thunk_worker");
    thunk_rounds();
    leave();
    return NULL;
}

/* ---- output ------------------------------------------------------------------------------ */

static char out[1 << 16];
static size_t out_len;

static void flush_out(void) {
    for (size_t done = 0; done < out_len;) {
        ssize_t n = write(1, out + done, out_len - done);
        if (n <= 0) _exit(95);
        done += (size_t)n;
    }
    out_len = 0;
}

static void put(const char* s) {
    size_t n = strlen(s);
    if (out_len + n > sizeof out) flush_out();
    memcpy(out + out_len, s, n);
    out_len += n;
}

static void print_paths(void) {
    char number[32];
    for (int i = 0; i < path_count; ++i) {
        snprintf(number, sizeof number, "%lu %lu", paths[i].bytes, paths[i].blocks);
        put(number);
        for (int f = paths[i].len - 1; f >= 0; --f) {
            put(" ");
            put(paths[i].names[f]);
        }
        put("\n");
    }
    flush_out();
}

int main(int argc, char** argv) {
    bool thunks = argc == 2 && strcmp(argv[1], "thunks") == 0;
    if (argc != 2 || (strcmp(argv[1], "all") != 0 && strcmp(argv[1], "fp") != 0 && !thunks)) {
        fprintf(stderr, "usage: unwind_shapes all|fp|thunks\n");
        return 2;
    }
    fp_only = strcmp(argv[1], "fp") == 0;
    rng = 88172645463325252ull;
    make_jit_thunk();
    enter("main");
    heapsnap_marker("start");
    if (thunks) {
        thunk_rounds();
        /* The same on three threads: on glibc's default stack, on a stack
         * of a size asked for, and on a stack of the program's own (1 MiB
         * with a guard page at its foot). */
        pthread_attr_t sized, given;
        pthread_attr_init(&sized);
        pthread_attr_setstacksize(&sized, 1 << 20);
        char* stack = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (stack == MAP_FAILED || mprotect(stack, 4096, PROT_NONE) != 0) _exit(94);
        pthread_attr_init(&given);
        pthread_attr_setstack(&given, stack, 1 << 20);
        const pthread_attr_t* attrs[] = {NULL, &sized, &given};
        for (uintptr_t t = 0; t < 3; ++t) {
            pthread_t thread;
            pthread_create(&thread, attrs[t], thunk_worker, (void*)(t + 1));
            pthread_join(thread, NULL);
        }
        heapsnap_marker("end");
        leave();
        print_paths();
        return 0;
    }

    random_paths(300);
    alternate();
    jump_site();
    if (!fp_only) signal_site();

    pthread_t threads[2];
    for (uintptr_t t = 0; t < 2; ++t) pthread_create(&threads[t], NULL, worker_main, (void*)(t + 1));
    for (int t = 0; t < 2; ++t) pthread_join(threads[t], NULL);

    heapsnap_marker("end");
    leave();
    print_paths();
    return 0;
}
