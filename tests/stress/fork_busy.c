/* fork_busy — fork while other threads allocate. The child inherits a
 * snapshot of the allocator and of the recorder taken at an arbitrary
 * moment of the other threads; it must neither deadlock nor lose its own
 * log.
 *
 * WORKERS threads malloc/free in a loop (sizes 16..1039) until told to
 * stop. Meanwhile main forks FORKS children, one after the other. Each
 * child: 100 x (malloc, free), child_keep() keeps malloc(4321), then
 * exit(7) (normal exit: the child's log gets its exit marker).
 * main waits for each child and checks it exited with 7.
 *
 * Child log, live at exit: 4321 bytes in 1 block from child_keep().
 * Output: "fork_busy: 30 children exited 7". Exit status 0; 3 if a child
 * did not exit with 7.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

enum { WORKERS = 6, FORKS = 30 };

static atomic_int stop;
static void* volatile child_block;

__attribute__((noinline)) void child_keep(void) {
    child_block = malloc(4321); /* @site:child_keep */
}

static void* worker(void* arg) {
    uintptr_t t = (uintptr_t)arg;
    void* held[8] = {0};
    for (unsigned i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); ++i) {
        unsigned k = (i + (unsigned)t) % 8;
        free(held[k]);
        held[k] = malloc(16 + (i * 31 + t) % 1024);
    }
    for (int k = 0; k < 8; ++k) free(held[k]);
    return NULL;
}

int main(void) {
    pthread_t workers[WORKERS];
    for (uintptr_t t = 0; t < WORKERS; ++t)
        if (pthread_create(&workers[t], NULL, worker, (void*)t) != 0) return 2;
    int good = 0;
    for (int n = 0; n < FORKS; ++n) {
        usleep(2000);
        pid_t child = fork();
        if (child < 0) return 2;
        if (child == 0) {
            for (int i = 0; i < 100; ++i) {
                void* volatile p = malloc(32 + i);
                free(p);
            }
            child_keep();
            exit(7);
        }
        int status = 0;
        if (waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 7) good++;
    }
    atomic_store(&stop, 1);
    for (int t = 0; t < WORKERS; ++t) pthread_join(workers[t], NULL);
    printf("fork_busy: %d children exited 7\n", good);
    return good == FORKS ? 0 : 3;
}
