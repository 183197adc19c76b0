// Symbolizer: turns (module, address) pairs from a recorded heap log into
// function names and source lines, after the traced process is gone.
//
// Why it is shaped this way:
//
// - Addresses come in as ELF virtual addresses of the module (runtime
//   address minus the module's load bias), not runtime addresses. The
//   traced process is dead, ASLR put every module somewhere different in
//   each run, and snapshots from two runs must resolve the same code to the
//   same names. A file-relative address is the only key that means the same
//   thing in every run, so it is also the cache key.
//
// - One libdwfl session (Dwfl) per module, each reported at base 0. With
//   base 0 every module's addresses are plain ELF vaddrs, so they overlap:
//   one Dwfl holding several modules could not tell them apart. A Dwfl per
//   module keeps lookups unambiguous, and each ELF (and its separate debug
//   file, found by libdwfl through /usr/lib/debug/.build-id and
//   .gnu_debuglink) is opened once per (path, build-id) and kept for the
//   life of the Symbolizer.
//
// - Never a wrong name. A stack that says "module+0x1234" costs the reader
//   a lookup; a stack that names the wrong function sends them chasing the
//   wrong code. So a file whose build-id differs from the one the process
//   recorded is not symbolized at all, and an ELF symbol is only used when
//   the address lies inside its recorded size. Anything uncertain gives one
//   frame with an empty function name, and the reason is reported once per
//   module in warnings(), not once per address (a mismatched libc would
//   otherwise print thousands of identical lines).
//
// - DWARF gives the inlined frames (one address can be several source
//   frames). The real function is named by the first of: DWARF's mangled
//   linkage name, a mangled ELF symbol (GCC gives functions with internal
//   linkage no linkage name, the symbol table still has it), DWARF's plain
//   name, the ELF symbol (modules without debug info). C++ names are
//   demangled in full, with parameter types, so "operator new(unsigned
//   long)" is recognisable in a report.
//
// - Results are cached per (module, vaddr): the same few thousand return
//   addresses appear in millions of recorded stacks. With a cache
//   directory they are also kept on disk per build-id (symbol_cache.h),
//   and a module whose every address is found there is never opened.
//
// - ELF symbols are looked up in a table sorted by address, built once per
//   module (symbol_table.h), not with dwfl_module_addrinfo, which scans the
//   whole symbol table on every call: on a clang compile's log, whose
//   libLLVM and libclang-cpp have tens of thousands of symbols, `heapsnap
//   report` took 29 s of CPU with it and takes 1.1 s without.
//
// elfutils errors never escape as exceptions; they become warnings. Not
// thread-safe: libdwfl sessions and the caches are unguarded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace heapsnap {

struct ModuleRef {
    // Path of the ELF file as recorded in the traced process
    // (e.g. /usr/lib/x86_64-linux-gnu/libc.so.6, or the exe's absolute path).
    std::string path;
    // Raw build-id bytes recorded in the process (not hex); empty = unknown,
    // then the file on disk is trusted without a check.
    std::string build_id;
};

struct SymbolFrame {
    // Demangled name ("foo", "std::vector<int>::push_back(int const&)",
    // "operator new(unsigned long)"); empty if unknown.
    std::string function;
    // Source file path as in DWARF, made absolute with the CU's comp_dir;
    // empty if unknown.
    std::string file;
    uint32_t line = 0;    // 0 if unknown
    std::string module;   // ModuleRef::path
    uint64_t offset = 0;  // the ELF virtual address that was looked up
    // True for an inlined function; it sits inside the next (outer) frame.
    bool inlined = false;
};

class Symbolizer {
public:
    // Without a persistent cache.
    Symbolizer();
    // With the symbol cache in `cache_dir` (symbol_cache.h; empty: none),
    // written back when the Symbolizer goes.
    explicit Symbolizer(const std::string& cache_dir);
    ~Symbolizer();
    Symbolizer(const Symbolizer&) = delete;
    Symbolizer& operator=(const Symbolizer&) = delete;

    // `vaddr` is an address inside `module` as an ELF virtual address of that
    // file. Callers pass return addresses minus 1, so vaddr points inside the
    // call instruction and the line shown is the call's, not the next one's.
    //
    // Returns the frames for this address, innermost first: inlined callees
    // (inlined = true, file:line inside the inlined function), then the real
    // function (inlined = false) at the call site of the outermost inlined
    // call. Always at least one frame. The reference stays valid for the
    // life of the Symbolizer.
    const std::vector<SymbolFrame>& symbolize(const ModuleRef& module, uint64_t vaddr);

    // Warnings collected so far, in order, each once.
    const std::vector<std::string>& warnings() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace heapsnap
