/* The controls of hostile_alloc.c. */
extern int hostile_signal;
extern int hostile_every;
extern int hostile_mask;
extern unsigned long hostile_mallocs, hostile_maps, hostile_unmaps;
extern unsigned long hostile_raised;
extern volatile int hostile_raising;
extern int hostile_trace;
extern long hostile_sizes[64];
extern int hostile_traced;
