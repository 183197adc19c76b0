/* signal_alloc — malloc from a signal handler while the interrupted thread
 * is itself allocating: the timer's SIGALRM lands anywhere, including in
 * the middle of the recorder's hook on the main thread.
 *
 * (malloc is not async-signal-safe; glibc tolerates it here because both
 * the main loop and the handler stay within their tcache bins after the
 * first calls, so the handler never waits for a lock the interrupted code
 * holds. The recorder must tolerate it too: real programs do this.)
 *
 * An interval timer sends SIGALRM every 200 µs; main mallocs and frees
 * 32-byte blocks in a loop until SIGNALS signals were handled. The handler
 * mallocs and frees 48 bytes, and every KEEP_EVERY-th signal calls
 * handler_keep(), which keeps malloc(777). The handler disarms the timer at
 * the last signal.
 *
 * Live from handler_keep() at "done" and at exit:
 *   SIGNALS / KEEP_EVERY = 20 blocks, 20 * 777 = 15540 bytes.
 * Output: "signal_alloc: 2000 signals, 20 kept". Exit status 0.
 *
 * signal_alloc _exit: the handler of the last signal leaves with _exit(7)
 * instead (printing "signal_alloc: _exit from the handler"), wherever the
 * main loop was, the recorder's hooks included. Live then: the same 20
 * blocks. Exit status 2 for any other argument.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

enum { SIGNALS = 2000, KEEP_EVERY = 100 };

static volatile sig_atomic_t handled;
static int leave_from_handler;
static void* kept[SIGNALS / KEEP_EVERY];
static volatile int kept_count;

__attribute__((noinline)) void* handler_keep(void) {
    return malloc(777); /* @site:handler_keep */
}

static void on_alarm(int sig) {
    (void)sig;
    if (handled >= SIGNALS) return;
    void* volatile p = malloc(48);
    free(p);
    handled++;
    if (handled % KEEP_EVERY == 0) kept[kept_count++] = handler_keep();
    if (handled == SIGNALS && leave_from_handler) {
        static const char said[] = "signal_alloc: _exit from the handler\n";
        ssize_t ignored = write(STDOUT_FILENO, said, sizeof said - 1);
        (void)ignored;
        _exit(7);
    }
    if (handled == SIGNALS) {
        struct itimerval off;
        memset(&off, 0, sizeof off);
        setitimer(ITIMER_REAL, &off, NULL);
    }
}

int main(int argc, char** argv) {
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "_exit") != 0)) return 2;
    leave_from_handler = argc == 2;
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
    struct itimerval every = {{0, 200}, {0, 200}};
    if (setitimer(ITIMER_REAL, &every, NULL) != 0) return 2;
    while (handled < SIGNALS) {
        void* volatile p = malloc(32);
        free(p);
    }
    heapsnap_marker("done");
    printf("signal_alloc: %d signals, %d kept\n", (int)handled, kept_count);
    return 0;
}
