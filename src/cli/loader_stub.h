// The code `heapsnap attach` leaves in the process to load the recorder in
// a thread of its own, and the block it reads and answers in
// (cli/inject.h, step 3; docs/design/attach.md).
//
// The stopped thread only maps one region (code page, then the block),
// and calls pthread_create(&t, NULL, code, block): its stop does not wait
// for dlopen and the recorder's start, which in a busy process wait for
// the CPU, for the malloc arena lock it shares with a running thread, and
// for the address-space lock. The new thread starts with every signal
// blocked (the stopped thread's mask during the call) and runs:
//
//   0. glibc's own two signals (cancellation, setxid) unblocked, as the
//      recorder's writer thread does: a setuid in another thread waits
//      for every thread to take its signal. Its name set (PR_SET_NAME).
//      The borrowed thread's own scheduler settings put back on itself
//      (sched_setattr, if `sched.size` is not 0): it inherited the short
//      slice the borrowed thread had during its stop (cli/short_slice.h),
//      and the recorder's writer thread, which it starts, inherits from it.
//   1. mprotect(block, PROT_READ | PROT_WRITE); the code stays read-only
//      and executable. Should it fail, the thread goes straight to 6.
//   2. pthread_detach(pthread_self()); free() of each `probes` block not 0
//      (the callocs that tried the arena's lock, inject.cpp).
//   3. dlopen(path, RTLD_NOW); null: outcome kNotLoaded, dlerror()'s text
//      left in `error_text` (the thread's own buffer, valid until it ends).
//   4. heapsnap_attach_v1(settings, reply, kReplyBytes) at the link map's
//      l_addr + attach_offset; its result (0 to 3) is the outcome.
//   5. outcome stored (one aligned 32-bit store: heapsnap reads it whole),
//      then wait for heapsnap to set `read` (1 ms naps, 30 s at most: a
//      heapsnap killed meanwhile leaves nothing behind).
//   6. The region is unmapped by a tail call of munmap, which returns to
//      pthread's thread start: the thread ends as any other.
//
// The code is position-independent, calls libc only through the block's
// pointers, and keeps the stack 16-byte aligned at each call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cli/short_slice.h"

namespace heapsnap::cli {

inline constexpr int32_t kLoaderRunning = -1;  // outcome until the thread stores it
inline constexpr int32_t kNotLoaded = 4;       // dlopen failed
inline constexpr size_t kReplyBytes = 4200;    // heapsnap_attach_v1's reply
inline constexpr size_t kProbeBlocks = 8;      // blocks the loader frees

// The block's fixed part, at its start; the strings follow it.
struct LoaderBlock {
    uint64_t pthread_self;  // libc's functions
    uint64_t pthread_detach;
    uint64_t dlopen;
    uint64_t dlerror;
    uint64_t munmap;
    uint64_t attach_offset;  // heapsnap_attach_v1 in the recorder's file
    uint64_t region;         // the mapping: code, then this block
    uint64_t region_bytes;
    uint64_t block_bytes;           // from this block's start to the region's end
    uint64_t path;                  // the recorder's path (a C string)
    uint64_t settings;              // NAME=value strings, an empty one last
    uint64_t reply;                 // kReplyBytes
    uint64_t error_text;            // out: dlerror(), if dlopen failed
    int32_t outcome;                // out: kLoaderRunning, then 0 to 3 or kNotLoaded
    int32_t read;                   // in: heapsnap has read the outcome
    char name[16];                  // the thread's name
    SchedAttributes sched;          // the borrowed thread's own settings; size 0: none
    uint64_t free;                  // libc's
    uint64_t probes[kProbeBlocks];  // blocks to free; 0: none
};

// The code, for a page of its own in the process; it starts at its
// first byte.
const uint8_t* loader_code();
size_t loader_code_bytes();

}  // namespace heapsnap::cli
