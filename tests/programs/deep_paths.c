/* deep_paths — allocations at the bottom of a recursion 40 frames deep,
 * for the stack cache's segments that join the last stack deeper than 32
 * frames (src/recorder/unwind_segments.h, Segment::outer_ips). Each of ROUNDS
 * rounds, at the bottom of `descend`'s recursion:
 *   1. a malloc through path_x1..3;
 *   2. a malloc through path_y1..3, same recursion: its walk joins the last
 *      stack at the recursion's bottom, 3 frames afresh (a segment);
 *   3. through path_x1..3 again, the recursion passing through `detour` 5
 *      levels above its bottom: the frames from there up are rewritten.
 * In round 2 on, step 1 rewrites them back, and step 2's stack is the one
 * of round 1: its segment holds again (frames the same up to the 32 below
 * its join, and those below not rewritten), so it needs no walk. Without
 * such segments step 2 walks every round.
 *
 * Usage: deep_paths ROUNDS. No stdio: it would allocate. Exit status 0.
 */
#include <stdlib.h>

#define DEPTH 40
#define DETOUR_AT 5

static void *volatile sink;

__attribute__((noinline)) static void path_x3(void) { free(sink = malloc(24)); }
__attribute__((noinline)) static void path_x2(void) { path_x3(); }
__attribute__((noinline)) static void path_x1(void) { path_x2(); }
__attribute__((noinline)) static void path_y3(void) { free(sink = malloc(40)); }
__attribute__((noinline)) static void path_y2(void) { path_y3(); }
__attribute__((noinline)) static void path_y1(void) { path_y2(); }

static void descend(int depth, void (*at_bottom)(void), int detour);

/* The level DETOUR_AT above the bottom, through another function. */
__attribute__((noinline)) static void detour(int depth, void (*at_bottom)(void)) {
    descend(depth - 1, at_bottom, 0);
}

__attribute__((noinline)) static void descend(int depth, void (*at_bottom)(void), int take_detour) {
    if (depth == 0) {
        at_bottom();  /* one call site for both paths: the caller's frame is the same */
        return;
    }
    if (take_detour && depth == DETOUR_AT)
        detour(depth, at_bottom);
    else
        descend(depth - 1, at_bottom, take_detour);
    sink = 0; /* not a tail call */
}

int main(int argc, char **argv) {
    static void (*const bottoms[3])(void) = {path_x1, path_y1, path_x1};
    static const int detours[3] = {0, 0, 1};
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    /* One call site for all three, so that main's frame is the same. */
    for (int i = 0; i < 3 * rounds; ++i) descend(DEPTH, bottoms[i % 3], detours[i % 3]);
    return 0;
}
