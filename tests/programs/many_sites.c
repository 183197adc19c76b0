/* many_sites — 8192 live blocks of 16 bytes, each allocated at the bottom
 * of its own 64-frame call chain (the malloc in descend), so a report of
 * its exit has 8192 call sites of 64 frames (the default depth; 129
 * below main): as many sites, and as deep, as a compiler's exit snapshot
 * holds, from a log of some 100 kilobytes. Each level calls through `left` or `right` by one bit of the
 * block's number (the bits repeat every 13 levels), so every chain is a
 * path of its own. Prints the number of blocks kept.
 */
#include <stdio.h>
#include <stdlib.h>

#define LEVELS 64
#define BLOCKS 8192

static void *kept[BLOCKS];

static void descend(int level, unsigned path, int slot);

__attribute__((noinline)) static void left(int level, unsigned path, int slot) {
    descend(level + 1, path, slot);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void right(int level, unsigned path, int slot) {
    descend(level + 1, path, slot);
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static void descend(int level, unsigned path, int slot) {
    if (level == LEVELS) {
        kept[slot] = malloc(16); /* @site:many_sites_leaf */
        return;
    }
    if (path >> (level % 13) & 1)
        right(level, path, slot);
    else
        left(level, path, slot);
    __asm__ volatile("" ::: "memory");
}

int main(void) {
    for (int i = 0; i < BLOCKS; ++i) descend(0, (unsigned)i, i);
    int n = 0;
    for (int i = 0; i < BLOCKS; ++i) n += kept[i] != NULL;
    printf("%d\n", n);
    return 0;
}
