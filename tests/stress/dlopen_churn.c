/* dlopen_churn PLUGIN — dlopen/dlclose of the same plugin ROUNDS times,
 * with an allocation inside the plugin every time, while ALLOCATORS other
 * threads allocate (so the recorder's module map changes under threads that
 * are unwinding).
 *
 * Round n: dlopen(PLUGIN), plugin_work(n) (its plugin_keep() block is kept
 * by the host), dlclose. Every round's block is still live after its
 * plugin was unloaded.
 *
 * Live from plugin_keep() at "done" and at exit:
 *   ROUNDS = 300 blocks, sum over n < 300 of (100 + n % 7) = 30897 bytes.
 * Output: "dlopen_churn: 300 rounds". Exit status 0; 2 if the plugin cannot
 * be loaded, 3 if dlclose fails.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <heapsnap/heapsnap.h>

enum { ROUNDS = 300, ALLOCATORS = 2 };

static void* kept[ROUNDS];
static atomic_int stop;

static void* allocator(void* arg) {
    (void)arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        void* volatile p = malloc(256);
        free(p);
    }
    return NULL;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: dlopen_churn PLUGIN\n");
        return 2;
    }
    pthread_t threads[ALLOCATORS];
    for (int t = 0; t < ALLOCATORS; ++t)
        if (pthread_create(&threads[t], NULL, allocator, NULL) != 0) return 2;
    heapsnap_marker("started");
    for (unsigned n = 0; n < ROUNDS; ++n) {
        void* plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!plugin) {
            fprintf(stderr, "%s\n", dlerror());
            return 2;
        }
        void* (*work)(unsigned) = (void* (*)(unsigned))dlsym(plugin, "plugin_work");
        if (!work) return 2;
        kept[n] = work(n);
        if (dlclose(plugin) != 0) return 3;
    }
    atomic_store(&stop, 1);
    for (int t = 0; t < ALLOCATORS; ++t) pthread_join(threads[t], NULL);
    heapsnap_marker("done");
    printf("dlopen_churn: %d rounds\n", ROUNDS);
    return 0;
}
