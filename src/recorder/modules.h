// The recorder's view of the loaded ELF modules (executable, shared
// libraries, dlopen'd plugins), used to turn a return address into
// (module id, ELF virtual address) when a stack is interned.
//
// Resolving at intern time, in the traced process, is what makes symbols
// exact across dlopen/dlclose: the reader never has to guess which module
// was mapped at an address at the time. Before each new stack is resolved
// the table is brought up to date if dl_iterate_phdr's load/unload counters
// moved (so a plugin's constructors, running inside dlopen, already see
// their module); that is one cheap call on the rare new-stack path, and it
// spares interposing dlopen (which would change dlopen's caller, and with
// it $ORIGIN and RUNPATH lookups).
//
// Every change is queued as an encoded ModuleLoad/ModuleUnload record for
// the writer, which emits queued metadata before any stack that uses it.
// All functions except init_exe_path()/exe_path() are called with the
// metadata lock held.
#pragma once

#include <cstdint>

#include "recorder/spinlock.h"

namespace heapsnap::recorder {

struct ResolvedFrame {
    uint32_t module;
    uint64_t vaddr;
};

SpinLock& metadata_lock();

// Brings the table up to date if modules were loaded or unloaded since the
// last scan (always, with `force`), queuing load/unload records. Caller
// holds the metadata lock.
void rescan_modules(bool force);

// rescan_modules(false) for a caller without the metadata lock, which it
// takes only if the loader's counters moved: interning a new stack checks
// on every insert, and the writer holds the lock often (stack_table.h).
void rescan_modules_if_changed();

// Resolves `ip` against the table as it is.
ResolvedFrame resolve_frame(uint64_t ip);

// Re-queues a load record for every loaded module (a fork child starts a
// new log that must describe the modules again).
void requeue_all_modules();

// Absolute path of the executable (from /proc/self/exe), read once at start
// and cached.
void init_exe_path();
const char* exe_path();

}  // namespace heapsnap::recorder
