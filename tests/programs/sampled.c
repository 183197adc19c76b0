/* sampled — known allocations to check `heapsnap run --sample-bytes`.
 *
 * Marker "start" (nothing kept yet), then:
 *   small_keep    1000000 x malloc(64)     = 64000000 bytes kept
 *   medium_keep     16000 x malloc(4000)   = 64000000 bytes kept
 *   big_keep           10 x malloc(1 MiB)  = 10485760 bytes kept
 *   churn          500000 x malloc(32) + free: nothing kept
 *   map_keep            1 x mmap(2 MiB)    = 2097152 bytes kept
 * then marker "kept", exit 0 without freeing.
 *
 * With --sample-bytes 65536: big_keep is exact (blocks of 64 KiB or more
 * are always recorded), the mmap is exact, churn nets to exactly zero
 * (every sampled block's free is recorded), and small_keep / medium_keep
 * are estimates from about 977 and 947 samples, binomial with standard
 * deviations of 3.2% and 3.1%: within 15% of the truth but once in about
 * a million runs (tests/integration/test_sampling.py).
 */
#include <stdlib.h>
#include <sys/mman.h>

#include <heapsnap/heapsnap.h>

enum { SMALL = 1000000, MEDIUM = 16000, BIG = 10, CHURN = 500000 };

__attribute__((noinline)) void* small_keep(void) {
    return malloc(64); /* @site:small_keep */
}

__attribute__((noinline)) void* medium_keep(void) {
    return malloc(4000); /* @site:medium_keep */
}

__attribute__((noinline)) void* big_keep(void) {
    return malloc(1 << 20); /* @site:big_keep */
}

__attribute__((noinline)) void churn(void) {
    for (int i = 0; i < CHURN; ++i) {
        void* volatile p = malloc(32); /* @site:churn */
        free(p);
    }
}

__attribute__((noinline)) void* map_keep(void) {
    return mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* @site:map_keep */
}

static void* kept[SMALL + MEDIUM + BIG];

int main(void) {
    heapsnap_marker("start");
    int n = 0;
    for (int i = 0; i < SMALL; ++i) kept[n++] = small_keep();
    for (int i = 0; i < MEDIUM; ++i) kept[n++] = medium_keep();
    for (int i = 0; i < BIG; ++i) kept[n++] = big_keep();
    churn();
    if (map_keep() == MAP_FAILED) return 2;
    heapsnap_marker("kept");
    return 0;
}
