// The recorder in a process it was not preloaded into: `heapsnap attach`
// loads it with dlopen (src/cli/inject.h) and calls heapsnap_attach_v1,
// `heapsnap detach` asks it over the control socket to stop
// (formats/control.md). docs/design/attach.md has the whole story.
//
// Binding. A dlopen'd library interposes nothing: every module's calls
// already go to the real functions through its GOT. So the recorder
// rewrites, in every loaded module but itself and ld.so, the GOT slots
// (JUMP_SLOT and GLOB_DAT relocations, found from the dynamic section:
// DT_JMPREL, DT_RELA, DT_SYMTAB, DT_STRTAB) of the functions it hooks
// to its hooks, the very functions LD_PRELOAD binds (hooks.cpp), making
// RELRO pages writable for the time of the write. Each rewritten slot and
// its previous value are kept, per module, to be put back at detach. The
// hooks reach the real functions by dlsym(RTLD_DEFAULT) instead of
// RTLD_NEXT: from a dlopen'd object, RTLD_NEXT searches only its own
// dependencies, and would miss an allocator the executable links
// (redis-server's jemalloc). Every one is resolved before the first slot
// is rewritten, and taken only if it is a definition outside this library
// (definitions.h): dlsym may answer with the executable's own PLT entry,
// which jumps through a slot this rewrites.
//
// Modules loaded later. dlopen is bound too, to a wrapper that binds the
// modules the real dlopen added. dlclose's hook drops the slots of the
// modules it unloaded.
//
// Detach. The slots get their previous values back, inside one
// dl_iterate_phdr pass (no module can be unmapped meanwhile); a thread
// still inside a hook finishes it, and a hook called later (through a
// function pointer the program took while bound) forwards to the real
// function: the library is never unloaded.
#pragma once

namespace heapsnap::recorder {

// Looks the real functions up (hooks.cpp), all at once, with
// dlsym(RTLD_DEFAULT) when attached, each checked to be a definition
// outside this library (definitions.h): before any slot is bound, in the
// thread that loaded the recorder (heapsnap_attach_v1). False if one the
// hooks cannot do without was not found.
bool resolve_real_functions();
// Binds the hooks in every loaded module; false if the real functions
// could not be found (nothing is bound then).
bool bind_hooks();
// Puts every slot back.
void unbind_hooks();
// The dlclose hook, after the real call, when attached.
void forget_unloaded_modules();

}  // namespace heapsnap::recorder
