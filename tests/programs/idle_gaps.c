/* idle_gaps — one thread, bursts of allocations with idle gaps between
 * them, so the times in the log can be checked against the gaps: a
 * single recording thread may reuse its last clock reading while the
 * writer's stamp tick is fresh (src/recorder/thread_buffer.h, "One
 * thread"), and the first event after a gap must not get a reading from
 * before it.
 *
 * Usage: idle_gaps    (no arguments; exits 0)
 *
 * Burst b = 0 .. 9: 2000 x (malloc(1000 + b), free), then a 20 ms sleep.
 * Every allocation of burst b has size 1000 + b, so a test can tell the
 * bursts apart in `heapsnap dump`: burst b + 1 starts at least 20 ms after
 * burst b ends.
 */
#include <stdlib.h>
#include <time.h>

int main(void) {
    for (int b = 0; b < 10; ++b) {
        for (int i = 0; i < 2000; ++i) {
            void* volatile p = malloc(1000 + (size_t)b);
            free(p);
        }
        struct timespec gap = {0, 20 * 1000 * 1000};
        while (nanosleep(&gap, &gap) != 0) {
        }
    }
    return 0;
}
