/* allocators — the same allocations whatever implements malloc: glibc's, or
 * jemalloc, tcmalloc or mimalloc preloaded after the recorder. The live set
 * at exit is known per call site (@site lines), so a test can compare it
 * site by site under each allocator; totals differ between them, as a
 * preloaded allocator may pull in libraries that allocate at start
 * (libstdc++'s emergency exception pool).
 *
 * Usage: allocators [EXIT_STATUS]   prints one line, returns EXIT_STATUS
 *        allocators wait            prints "ready pid=N", exits at end of input
 *
 * Live at exit (requested sizes), per site:
 *   keep_small     20 x malloc(48)                          960 in 20
 *   keep_calloc    3 x calloc(25, 40)                      3000 in 3
 *   keep_realloc   realloc 100 -> 300 -> 7000 (one block)  7000 in 1
 *   keep_aligned   posix_memalign(64, 1000) x 2            2000 in 2
 *   keep_page      aligned_alloc(4096, 8192)               8192 in 1
 *   keep_large     malloc(300000) (a large class)        300000 in 1
 *   keep_huge      malloc(5 MiB) (mapped for itself)    5242880 in 1
 *   thread_keep    4 x malloc(512) on a second thread      2048 in 4
 *   churn          5000 x malloc(24) freed at once            0
 *   handed         malloc(4000) freed by the other thread     0
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void* volatile kept[40];
static void* volatile scratch;
static void* volatile handed_block;

static void keep_small(void) {
    for (int i = 0; i < 20; ++i)
        kept[i] = malloc(48); /* @site:keep_small */
}

static void keep_calloc(void) {
    for (int i = 0; i < 3; ++i)
        kept[20 + i] = calloc(25, 40); /* @site:keep_calloc */
}

static void keep_realloc(void) {
    void* p = malloc(100); /* @site:realloc_seed */
    p = realloc(p, 300);
    kept[23] = realloc(p, 7000); /* @site:keep_realloc */
}

static void keep_aligned(void) {
    for (int i = 0; i < 2; ++i) {
        void* p = NULL;
        if (posix_memalign(&p, 64, 1000) != 0) /* @site:keep_aligned */
            exit(97);
        kept[24 + i] = p;
    }
}

static void keep_page(void) { kept[26] = aligned_alloc(4096, 8192); /* @site:keep_page */ }

static void keep_large(void) { kept[27] = malloc(300000); /* @site:keep_large */ }

static void keep_huge(void) {
    char* p = malloc(5 << 20); /* @site:keep_huge */
    memset(p, 1, 5 << 20);
    kept[28] = p;
}

static void churn(void) {
    static void* blocks[5000];
    for (int i = 0; i < 5000; ++i)
        blocks[i] = malloc(24); /* @site:churn */
    for (int i = 0; i < 5000; ++i)
        free(blocks[i]);
}

static void handed(void) { handed_block = malloc(4000); /* @site:handed */ }

static void* other_thread(void* unused) {
    (void)unused;
    for (int i = 0; i < 4; ++i)
        kept[30 + i] = malloc(512); /* @site:thread_keep */
    free(handed_block);
    return NULL;
}

int main(int argc, char** argv) {
    int wait = argc > 1 && strcmp(argv[1], "wait") == 0;
    keep_small();
    keep_calloc();
    keep_realloc();
    keep_aligned();
    keep_page();
    keep_large();
    keep_huge();
    churn();
    handed();
    pthread_t t;
    if (pthread_create(&t, NULL, other_thread, NULL) != 0 || pthread_join(t, NULL) != 0)
        return 96;
    if (wait) {
        printf("ready pid=%d\n", (int)getpid());
        fflush(stdout);
        char line[64];
        while (fgets(line, sizeof line, stdin))
            ;
        return 0;
    }
    printf("allocators: 8 sites, 5566080 bytes kept in 33 blocks\n");
    return argc > 1 ? atoi(argv[1]) : 0;
}
