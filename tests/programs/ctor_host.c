/* ctor_host — linked with libctor_alloc (tests/programs/ctor_alloc.c),
 * whose constructor allocates 100 blocks before main; main allocates
 * nothing. Exit status 0 if the constructor ran.
 */
int ctor_alloc_blocks(void);

int main(void) { return ctor_alloc_blocks() == 100 ? 0 : 1; }
