/* sigkill_self — dies by SIGKILL with a marker on disk: the log has no
 * "exit" marker and no End record, and must still read back.
 *
 * doomed_block() keeps malloc(12345); marker "before-kill"; then a 300 ms
 * sleep (the writer cuts a frame right after each marker and at least every
 * 100 ms, so the marker is on disk by then); then SIGKILL to itself.
 * Live at "before-kill": 12345 bytes in 1 block.
 * Exit: killed by signal 9 (a launcher reports 137).
 */
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

static void* volatile doomed;

__attribute__((noinline)) void doomed_block(void) {
    doomed = malloc(12345); /* @site:doomed_block */
}

int main(void) {
    doomed_block();
    heapsnap_marker("before-kill");
    struct timespec pause = {0, 300 * 1000 * 1000};
    while (nanosleep(&pause, &pause) != 0) {
    }
    kill(getpid(), SIGKILL);
    return 1;
}
