/* dying MODE — a process that ends without a normal exit: by _exit, whose
 * log still ends as at exit (the recorder's _exit hook), or by a signal,
 * whose log has no exit marker and no End record and must still read back
 * up to its last frame.
 *
 * doomed_keep() keeps 2 x malloc(2468); marker "before-death"; a 300 ms
 * pause (the writer cuts a frame right after each marker and every 100 ms,
 * so everything is on disk by then); then, by MODE:
 *   _exit      _exit(4)                  exit status 4
 *   abort      abort()                   SIGABRT: 134 from a launcher
 *   segv       a write through NULL      SIGSEGV: 139 from a launcher
 *   quick_exit quick_exit(4), whose at_quick_exit handler frees one of
 *              the two blocks: 2468 bytes in 1 block live at its end
 *   now        _exit(4) right after doomed_keep(): no marker, no pause
 *              (before the writer's first frame cut)
 *   abort-now  abort() right after doomed_keep(): the process is gone
 *              before the writer's first frame cut
 * Before dying it prints "dying: MODE" (unbuffered write).
 *
 * Live from doomed_keep() at "before-death" and at the end of the log:
 * 4936 bytes in 2 blocks. Exit status 2 for a bad MODE.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

static void* volatile kept[2];
static volatile int two = 2;
static int* volatile nowhere;

__attribute__((noinline)) void doomed_keep(void) {
    for (int i = 0; i < two; ++i) kept[i] = malloc(2468); /* @site:doomed_keep */
}

static void free_one(void) { free(kept[1]); }

static void say(const char* s) {
    ssize_t ignored = write(STDOUT_FILENO, s, strlen(s));
    (void)ignored;
}

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    const char* mode = argv[1];
    if (strcmp(mode, "_exit") != 0 && strcmp(mode, "abort") != 0 && strcmp(mode, "segv") != 0 &&
        strcmp(mode, "now") != 0 && strcmp(mode, "abort-now") != 0 && strcmp(mode, "quick_exit") != 0)
        return 2;
    doomed_keep();
    if (strcmp(mode, "now") == 0) {
        say("dying: now\n");
        _exit(4);
    }
    if (strcmp(mode, "abort-now") == 0) {
        say("dying: abort-now\n");
        abort();
    }
    heapsnap_marker("before-death");
    struct timespec pause = {0, 300 * 1000 * 1000};
    while (nanosleep(&pause, &pause) != 0) {
    }
    say("dying: ");
    say(mode);
    say("\n");
    if (strcmp(mode, "_exit") == 0) _exit(4);
    if (strcmp(mode, "quick_exit") == 0) {
        at_quick_exit(free_one);
        quick_exit(4);
    }
    if (strcmp(mode, "abort") == 0) abort();
    *nowhere = 1;
    return 1;
}
