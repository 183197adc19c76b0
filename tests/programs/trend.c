/* trend — a leak, a filling cache, a warming index and noise side by side
 * over five rounds, so a trend over the round markers (`heapsnap diff
 * 'LOG@*'`) tells them apart with known leak confidences, and `heapsnap
 * report` has known totals, call sites and a known size histogram.
 *
 * Usage: trend    (no arguments; prints "done" and exits 0)
 *
 * Only write(2) is used for output and nothing else allocates: stdio would
 * allocate its buffer, so every number below is exact.
 *
 * Before round 1, size_mix() allocates blocks kept to the end:
 *   mix_small   4 x malloc(24), 3 x malloc(100), 2 x malloc(5000)
 *                                                10396 bytes  9 blocks
 *   mix_large   1 x malloc(200000) (>= 128 KiB: glibc mmaps it; a "large"
 *               block of the report)            200000 bytes  1 block
 * Round r = 1 .. 5, then heapsnap_marker("r<r>"):
 *   leak_request   10 x malloc(1000), never freed: +10000 bytes every round
 *   cache_fill     rounds 1 and 2 only: 64 x malloc(1024), never freed;
 *                  flat from round 2 on
 *   warm_index     96, 80, 4, 2, 1 x malloc(1024) in rounds 1 .. 5, never
 *                  freed: grows at every round, by less and less
 *   noise_buffers  10*r x (malloc(64), free) (temporary allocations), then
 *                  odd r: 3 x malloc(3000) kept; even r: those 3 freed
 * Then main returns: the "exit" marker follows r5 with no event between,
 * an idle step that the trend leaves out of its score.
 *
 * Live per site (bytes / blocks) at each marker, and the trend over
 * LOG@* (r1 .. r5, exit):
 *   leak_request   10000/10 20000/20 30000/30 40000/40 50000/50 50000/50
 *                  confidence 1 (grew by the same amount at every scored
 *                  step), flagged
 *   warm_index     98304/96 180224/176 184320/180 186368/182 187392/183
 *                  187392/183
 *                  confidence 0.6333: steps of 80, 4, 2, 1 KiB, median
 *                  3 KiB, so (1 + 2 + 3 * 2/3 + 4 * 1/3) / 10; not
 *                  flagged although it grew at every step
 *   cache_fill     65536/64 131072/128, then 131072/128 to exit
 *                  confidence 0.1 (grew only in step 1 of 1+2+3+4)
 *   noise_buffers  9000/3 0/0 9000/3 0/0 9000/3 9000/3
 *                  confidence 0 (gave back all it took)
 *   mix_small, mix_large: constant, not in the trend
 * Order of the trend: leak_request, warm_index, cache_fill, noise_buffers.
 *
 * The moment r5 (heapsnap report LOG@r5):
 *   live heap 587860 bytes in 374 blocks, no mmap; peak = live (587860,
 *   reached by the last noise block of round 5)
 *   heap allocations 530: 10 mix + 50 leak + 128 cache + 183 warm + 150
 *   churn + 9 noise
 *   temporary 150 (the churn of noise_buffers: 10+20+30+40+50)
 *   sites by bytes: mix_large 200000/1, warm_index 187392/183, cache_fill
 *     131072/128, leak_request 50000/50, mix_small 10396/9, noise_buffers
 *     9000/3
 *   functions by bytes: size_mix 210396/10 (2 sites), warm_index
 *     187392/183, cache_fill 131072/128, leak_request 50000/50,
 *     noise_buffers 9000/3
 *   size classes (blocks, bytes):
 *     [16, 31]            4        96
 *     [64, 127]           3       300
 *     [512, 1023]        50     50000   leak_request
 *     [1024, 2047]      311    318464   cache_fill, warm_index
 *     [2048, 4095]        3      9000   noise_buffers
 *     [4096, 8191]        2     10000
 *     [131072, 262143]    1    200000   large
 * Growth r1 -> r5 (heapsnap diff LOG@r1 LOG@r5): leak_request +40000
 * (+40 blocks), cache_fill +65536 (+64), warm_index +89088 (+87);
 * noise_buffers and size_mix 0.
 *
 * Each allocation line carries an @site:NAME comment; the tests find line
 * numbers by searching for it.
 */
#include <stdlib.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

/* Loop bounds the compiler cannot see, so no loop is unrolled into several
 * call sites: each site below is exactly one stack. */
static volatile int n_rounds = 5, n_leak = 10, n_cache = 64, n_cache_rounds = 2, n_churn = 10, n_noise = 3,
                    n_mix = 9;
static volatile int n_warm[5] = {96, 80, 4, 2, 1};

static const size_t mix_sizes[9] = {24, 24, 24, 24, 100, 100, 100, 5000, 5000};
static const char* const labels[5] = {"r1", "r2", "r3", "r4", "r5"};

/* Volatile so the compiler can neither drop a malloc/free pair nor a block
 * that is never read. */
static void* volatile mix_blocks[9];
static void* volatile large_block;
static void* volatile leak_blocks[50];
static void* volatile cache_blocks[128];
static void* volatile warm_blocks[183];
static void* volatile noise_blocks[3];
static void* volatile churn_block;
static int leaked, cached, warmed;

__attribute__((noinline)) void size_mix(void) {
    for (int i = 0; i < n_mix; ++i) mix_blocks[i] = malloc(mix_sizes[i]); /* @site:mix_small */
    large_block = malloc(200000); /* @site:mix_large */
}

__attribute__((noinline)) void leak_request(void) {
    for (int i = 0; i < n_leak; ++i) leak_blocks[leaked++] = malloc(1000); /* @site:leak_request */
}

__attribute__((noinline)) void cache_fill(int round) {
    if (round > n_cache_rounds) return;
    for (int i = 0; i < n_cache; ++i) cache_blocks[cached++] = malloc(1024); /* @site:cache_fill */
}

__attribute__((noinline)) void warm_index(int round) {
    for (int i = 0; i < n_warm[round - 1]; ++i) warm_blocks[warmed++] = malloc(1024); /* @site:warm_index */
}

__attribute__((noinline)) void noise_buffers(int round) {
    for (int i = 0; i < round * n_churn; ++i) {
        churn_block = malloc(64); /* @site:noise_churn */
        free(churn_block);
    }
    if (round % 2) {
        for (int i = 0; i < n_noise; ++i) noise_blocks[i] = malloc(3000); /* @site:noise_buffers */
    } else {
        for (int i = 0; i < n_noise; ++i) free(noise_blocks[i]);
    }
}

int main(void) {
    size_mix(); /* @site:call_mix */
    for (int round = 1; round <= n_rounds; ++round) {
        leak_request(); /* @site:call_leak */
        cache_fill(round); /* @site:call_cache */
        warm_index(round); /* @site:call_warm */
        noise_buffers(round); /* @site:call_noise */
        heapsnap_marker(labels[round - 1]);
    }
    static const char done[] = "done\n";
    if (write(STDOUT_FILENO, done, sizeof done - 1) < 0) return 4;
    return 0;
}
