// Where a function the recorder hooks is defined in this process: the
// "real" function a hook calls (hooks.cpp) and a bound slot's target at
// detach (attach.cpp).
//
// dlsym's answer is not always a definition. A non-PIE executable that
// takes the address of a function it imports (Debian's python3 takes
// malloc's and free's) exports that name as an *undefined* dynamic symbol
// whose value is its own PLT entry, the canonical address every module's
// function pointer must compare equal to. dlsym looks symbols up as a data
// reference does (not as a PLT call, which skips such entries), so
// dlsym(RTLD_DEFAULT, "malloc") there returns the executable's PLT entry,
// which jumps through the executable's GOT slot: the slot attach rewrites
// to the hook, and the hook would call itself. The recorder's own
// definitions would be returned too if the recorder were in the global
// scope.
//
// So an answer is taken only when the module mapped at it has a defined
// dynamic symbol of that name there, and that module is not the recorder;
// otherwise the first module in link-map order (the executable, what it
// links, the dlopen'd modules: the order of the global scope) that defines
// the name (its default version), but the recorder and the dynamic
// linker, gives the address. A GNU indirect function's address is its
// resolver's answer.
#pragma once

namespace heapsnap::recorder {

// `candidate`: dlsym's answer for `name`, or null. Returns the definition
// the process itself uses, or null if no module but the recorder defines
// the name. Reads only the modules' dynamic sections; calls no function
// that allocates, but dl_iterate_phdr when `candidate` is refused.
void* definition_of(const char* name, void* candidate);

// Whether `p` lies in the recorder's own mapping.
bool in_recorder(const void* p);

}  // namespace heapsnap::recorder
