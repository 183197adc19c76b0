/* forker — a parent and a forked child, each with its own log and its own
 * exact live set.
 *
 * Parent, before fork:  parent_keep() 2 x malloc(1000), one of them freed by
 *                       the child (in the child's copy only)
 * Child:                frees one inherited block (a free of an address its
 *                       log never saw allocated: ignored by replay),
 *                       child_leak() 3 x malloc(3333), exits normally.
 * Parent, after wait:   parent_after() 1 x malloc(50).
 *
 * Live at exit:
 *   parent log: 2050 bytes in 3 blocks (2 x 1000 from parent_keep, 50 from parent_after)
 *   child log:  9999 bytes in 3 blocks (3 x 3333 from child_leak); the
 *               inherited blocks are not in the child's log at all.
 * Exit status: 0, or 10 + the child's status if the child did not exit 0.
 */
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void* volatile parent_blocks[3];
static void* volatile child_blocks[3];
/* Loop bounds the compiler cannot see, so it cannot unroll the loops into
 * one call site per iteration: each site is one stack. */
static volatile int two = 2, three = 3;

__attribute__((noinline)) void parent_keep(void) {
    for (int i = 0; i < two; ++i) parent_blocks[i] = malloc(1000); /* @site:parent_keep */
}

__attribute__((noinline)) void child_leak(void) {
    for (int i = 0; i < three; ++i) child_blocks[i] = malloc(3333); /* @site:child_leak */
}

__attribute__((noinline)) void parent_after(void) {
    parent_blocks[2] = malloc(50); /* @site:parent_after */
}

int main(void) {
    parent_keep();
    pid_t child = fork();
    if (child < 0) return 2;
    if (child == 0) {
        free(parent_blocks[0]);
        child_leak();
        exit(0);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child) return 3;
    parent_after();
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return 10 + (WIFEXITED(status) ? WEXITSTATUS(status) : 99);
    return 0;
}
