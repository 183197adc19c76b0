/* alloc_pattern — calls every interposed function once or twice with known
 * sizes, so a test can check the decoded log record by record and the live
 * set at exit to the byte.
 *
 * Usage: alloc_pattern [EXIT_STATUS]   (default 0; returned from main, so the
 * normal exit path and its "exit" marker run whatever the status)
 *
 * No stdio, no threads: nothing but the calls below allocates, so the counts
 * are exact.
 *
 * Heap, live at exit (requested sizes):
 *   malloc(100)                                   kept     100
 *   malloc(200)                                   freed
 *   calloc(10, 30)                                kept     300
 *   realloc(NULL, 50) then realloc(p, 500)        kept     500
 *   malloc(60) then realloc(p, 0)                 freed (realloc to 0 frees)
 *   reallocarray(NULL, 8, 16) then (p, 16, 16)    kept     256
 *   memalign(64, 1000)                            kept    1000
 *   posix_memalign(256, 2000)                     kept    2000
 *   aligned_alloc(128, 384)                       freed
 *   aligned_alloc(4096, 8192)                     kept    8192
 *   valloc(3000)                                  kept    3000
 *   pvalloc(5000)                                 kept    5000 (pvalloc rounds up; the log keeps the request)
 *   1000 x (malloc(24), free)                     churn
 *   free(NULL)                                    not recorded
 *                                           total 20348 bytes in 9 blocks
 *
 * Records (dump lines): alloc fn=malloc 1003, calloc 1, realloc 2,
 * reallocarray 2, memalign 1, posix_memalign 1, aligned_alloc 2, valloc 1,
 * pvalloc 1 (14 + 1000 = 1014 allocs); free 1005 (200, 1000 churn, the old
 * blocks of realloc(p, 500), realloc(p, 0) and the reallocarray growth, the
 * 384-byte aligned block).
 *
 * Anonymous mmap, live at exit (P = page size):
 *   mmap 3P                                       kept     3P
 *   mmap 2P, munmap 2P                            gone
 *   mmap 4P, munmap of its first page             kept     3P (one region)
 *                                           total 6P in 2 regions
 * Records: mmap 3, munmap 2.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

/* Volatile so the compiler can neither drop a malloc/free pair nor fold a
 * realloc: every call below reaches the allocator. */
static void* volatile kept[16];
static void* volatile scratch;

static void* anon_map(size_t length) {
    void* p = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) _exit(99);
    return p;
}

int main(int argc, char** argv) {
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    /* Opaque to the compiler, which would turn realloc(NULL, n) into malloc(n). */
    void* volatile null = NULL;
    volatile size_t zero = 0;

    kept[0] = malloc(100);
    scratch = malloc(200);
    free(scratch);
    kept[1] = calloc(10, 30);

    scratch = realloc(null, 50);
    kept[2] = realloc(scratch, 500);

    scratch = malloc(60);
    scratch = realloc(scratch, zero);

    scratch = reallocarray(null, 8, 16);
    kept[3] = reallocarray(scratch, 16, 16);

    kept[4] = memalign(64, 1000);
    void* aligned = NULL;
    if (posix_memalign(&aligned, 256, 2000) != 0) return 98;
    kept[5] = aligned;
    scratch = aligned_alloc(128, 384);
    free(scratch);
    kept[6] = aligned_alloc(4096, 8192);
    kept[7] = valloc(3000);
    kept[8] = pvalloc(5000);

    for (int i = 0; i < 1000; ++i) {
        scratch = malloc(24);
        free(scratch);
    }
    free(NULL);

    kept[9] = anon_map(3 * page);
    void* gone = anon_map(2 * page);
    munmap(gone, 2 * page);
    char* trimmed = anon_map(4 * page);
    munmap(trimmed, page);
    kept[10] = trimmed + page;

    return argc > 1 ? atoi(argv[1]) : 0;
}
