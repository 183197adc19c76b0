// How to step from a frame to its caller, per code address: the x86-64
// .eh_frame CFI row of that address, reduced to the three registers a walk
// needs (rsp, rbp, rip) and cached for the life of the process.
//
// Why our own CFI reader: with a reduced rule per address a step is two or
// three loads (unwind.h says what that buys). Only the shapes compilers
// emit at call sites are reduced:
//   CFA  = rsp|rbp + n, or *(rsp|rbp + n) (a realigned frame: GCC's DRAP);
//   rip  = *(CFA + n) or *(rsp|rbp + n);
//   rbp  = unchanged, *(CFA + n) or *(rsp|rbp + n).
// Anything else (another register as CFA base, DW_CFA_register, val rules,
// other expressions, an object without .eh_frame_hdr) is Unsupported and
// the caller steps that stack by every register's rule instead
// (cfi_walk.h), so an unusual frame costs time, never a wrong frame. So is
// the signal trampoline: below it lies a frame stopped at any instruction,
// not at a call, where compilers' CFI is not always right (GCC's DRAP
// epilogues keep an rbp rule that reads through the already restored
// rbp), and only the full walk checks each word before it reads it. An undefined rip or rbp marks the outermost frame,
// as libunwind's unw_step has it; so does a return address that no FDE
// covers, where the frame's rbp is 0 (NoInfo: glibc's _dl_start_user,
// below every shared library's constructors, which a program's startup
// allocations pass through). Where its rbp is not
// 0, libunwind guesses the caller by the frame pointer if rbp lies just
// above the frame's sp and ends the stack otherwise, and so does the walk
// (unwind_step.h, walk_rule): a JIT's code (node's V8) and hand-written
// assembly have no CFI but keep rbp chains; a JVM's compiled code keeps
// other data in rbp.
// Like the rest, this follows libunwind as Debian builds it for x86-64,
// without .debug_frame lookups.
//
// The cache is one insert-only open-addressing table shared by all threads:
// lookups are lock-free (acquire load of the key, whose rule was written
// before the key was published); a miss reads the CFI (through
// _dl_find_object, lock-free and async-signal-safe, unlike dl_iterate_phdr)
// and claims an empty slot with a CAS. Two threads missing the same address
// may both insert it; both copies are equal. When the table passes half
// full a table four times larger replaces it and refills on demand from
// the tables it replaced (a rule's CFI is read once: on a compile, each
// replacement had read every hot address's CFI again); old tables are
// never unmapped, so a reader racing the switch and a rule pointer handed
// out stay valid. A slot claimed by a thread that is
// interrupted for good (a fork child, a dying thread) before it publishes
// is lost, nothing more. Rejected: a per-thread cache as in libunwind
// (every thread pays every miss, and memory grows with threads); a lock
// around misses (a fork child could inherit it held).
//
// Caveat shared with libunwind's trace cache: a rule is keyed by address
// only. A library unloaded and a *different* one mapped at the same address
// would meet the old rules; glibc offers no cheap load/unload generation to
// check against on every stack (dl_iterate_phdr takes the loader lock).
#pragma once

#include <cstdint>

namespace heapsnap::recorder {

struct FrameRule {
    // NoInfo: no FDE covers the address (in a loaded object's code or in
    // none), which is neither a PLT entry nor a signal trampoline; the
    // frame is the outermost if its rbp is 0 (libunwind's end of the frame
    // chain) or out of the range in which libunwind guesses its caller by
    // rbp, and stepped by rbp otherwise (unwind_step.h, walk_rule).
    enum Kind : uint8_t { Step, Outermost, Unsupported, NoInfo };
    // Where a value lives: Cfa, Rsp, Rbp name the base of an address
    // (base + offset is read); Same keeps the callee's rbp.
    enum Base : uint8_t { Same, Cfa, Rsp, Rbp };

    Kind kind;
    Base cfa_base;   // Rsp or Rbp
    bool cfa_deref;  // CFA = *(base + cfa_offset) instead of base + cfa_offset
    Base ra_base;    // Cfa, Rsp or Rbp
    Base rbp_base;   // Same, Cfa, Rsp or Rbp
    int32_t cfa_offset;
    int32_t ra_offset;
    int32_t rbp_offset;
};

// The rule of the code at `pc`, a return address minus one (the call
// instruction: a call may be the last instruction of its function). Never
// null; the pointer stays valid for the life of the process.
const FrameRule* frame_rule(uint64_t pc);

}  // namespace heapsnap::recorder
