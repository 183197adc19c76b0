/* shared_tops — two paths to one allocation that share their three
 * innermost frames, at the same stack pointer, and part below them, taken
 * in turn: as bash's xmalloc is reached through the same two or three
 * callers from two places of its interpreter. Each of ROUNDS rounds:
 *   1. a malloc through via_a, then through_2, through_1, leaf;
 *   2. the same through via_b.
 * Each walk joins the last stack at main's frame (the other path's) and
 * keeps its four frames as a segment (src/recorder/unwind_segments.cpp,
 * keep_segment). The two segments start with the same three frames; kept
 * side by side, both hold from round 2 on and no allocation walks. While a
 * segment replaced any other that started with the same three frames,
 * each evicted the other and every allocation walked: bash looping over
 * an associative array walked for a third of its 4.2 M allocations.
 *
 * Usage: shared_tops ROUNDS. No stdio: it would allocate. Exit status 0.
 */
#include <stdlib.h>

static void *volatile sink;

__attribute__((noinline)) static void leaf(void) { free(sink = malloc(32)); }
__attribute__((noinline)) static void through_2(void) { leaf(); sink = 0; }
__attribute__((noinline)) static void through_1(void) { through_2(); sink = 0; }
/* Alike, so that the frames above them lie at the same addresses. */
__attribute__((noinline)) static void via_a(void) { through_1(); sink = 0; }
__attribute__((noinline)) static void via_b(void) { through_1(); sink = 0; }

int main(int argc, char **argv) {
    static void (*const paths[2])(void) = {via_a, via_b};
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    /* One call site for both, so that main's frame is the same. */
    for (int i = 0; i < 2 * rounds; ++i) paths[i % 2]();
    return 0;
}
