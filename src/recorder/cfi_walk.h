// The calling thread's stack stepped by the full CFI of every frame
// (cfi.h): every register's rule, DWARF expressions, signal frames. The
// fallback of the fast walk (unwind.cpp), for stacks with a frame its
// reduced rules (frame_rules.h) do not cover: a signal handler's, code
// whose CFA is another register or whose return address is kept in one,
// a return address that no FDE covers and whose frame-pointer guess needs
// reads the fast walk cannot prove safe.
//
// It reports the frames libunwind's unw_backtrace reports (Debian's
// x86-64 build, local, without .debug_frame), and it is slow the same way:
// each frame's CFI is read afresh, nothing is cached. It starts from every
// callee-saved register of its own frame, as unw_getcontext does, and
// steps the recorder's frames by their CFI like the program's, so that
// those registers are right where a frame's rule reads them. Below a
// signal frame every register is the interrupted one, taken from the
// signal's ucontext (by glibc's CFI of its restorer, or where a restorer
// has none, by the kernel's frame layout as libunwind does).
//
// Every read outside the thread's known stack (unwind_step.h, readable) is
// checked first, without a descriptor: rt_sigprocmask with an invalid
// `how` copies the 8-byte set from the address before it looks at `how`,
// so it fails with EFAULT where the word is unreadable and with EINVAL
// otherwise, and changes nothing. An unreadable word ends the stack
// there, where libunwind's checked read ends it too.
#pragma once

#include <cstdint>

namespace heapsnap::recorder {

// Fills ips with the frames of the calling thread's stack, innermost
// first, starting with the return address into the caller of
// cfi_walk_stack: at most `max` frames walked, of which those in [own_start,
// own_end) (the recorder's) are left out. Returns the count kept.
int cfi_walk_stack(uint64_t* ips, int max, uint64_t own_start, uint64_t own_end);

// Whether the aligned 8-byte word holding `addr` can be read (the check
// above); errno is left alone.
bool word_readable(uint64_t addr);

}  // namespace heapsnap::recorder
