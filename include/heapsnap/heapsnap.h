/* heapsnap — the program-side API of the heapsnap recorder.
 *
 * Include this header and call heapsnap_marker("after warm-up") to record a
 * named moment in the log of the running process; `heapsnap snapshot LOG
 * --at "after warm-up"` and `heapsnap diff LOG@"after warm-up" LOG@exit`
 * then use it.
 *
 * Nothing needs to be linked: the recorder (libheapsnap_preload.so, loaded
 * with `heapsnap run` or LD_PRELOAD) defines heapsnap_marker_v1, and this
 * header refers to it weakly. Without the recorder the weak reference is
 * null and heapsnap_marker() does nothing and returns 0.
 *
 * Thread-safe; may be called from any thread. Not async-signal-safe.
 */
#ifndef HEAPSNAP_HEAPSNAP_H
#define HEAPSNAP_HEAPSNAP_H

#ifdef __cplusplus
extern "C" {
#endif

/* Defined by the recorder. Returns 1 if the marker was recorded, 0 if the
 * process is not being recorded. */
extern int heapsnap_marker_v1(const char* label) __attribute__((weak));

/* Records a marker labelled `label` (at most 255 bytes are kept). Returns 1
 * if it was recorded, 0 when the recorder is not loaded or not recording.
 * Markers are numbered by their order in the log (`heapsnap markers LOG`),
 * which the writer decides: two threads marking at once get the numbers of
 * their moments, not of their calls. */
static inline int heapsnap_marker(const char* label) { return heapsnap_marker_v1 ? heapsnap_marker_v1(label) : 0; }

#ifdef __cplusplus
}
#endif

#endif /* HEAPSNAP_HEAPSNAP_H */
