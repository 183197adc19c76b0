// The ELF symbols of one module, sorted by address, so that naming an
// address is a bisection instead of a scan.
//
// Why not dwfl_module_addrinfo: it walks the module's whole symbol table on
// every call. On the log of a clang compile (libLLVM-14 and libclang-cpp,
// tens of thousands of symbols each) `heapsnap report` spent 29 s of CPU in
// it for a few thousand distinct return addresses. The table is built once
// per module, from the same symbols libdwfl reads (dwfl_module_getsymtab:
// .symtab or .dynsym, a separate debug file's, MiniDebugInfo's).
//
// It names an address as the symbolizer used dwfl_module_addrinfo to, by
// the same rules (elfutils' __libdwfl_addrsym):
//   - only a symbol with a size whose range holds the address names it
//     (symbolizer.h: never a wrong name); undefined and unnamed symbols and
//     those of type SECTION, FILE or TLS never do;
//   - global and weak symbols first; local ones only if none of those
//     holds the address and no sizeless global one starts exactly at it;
//   - among those that hold it, the one starting closest below it; among
//     several starting there, in table order, a smaller one replaces the
//     choice unless its binding is weaker, a stronger binding unless it is
//     larger (global over weak over local).
// One difference: libdwfl lets a symbol of stronger binding that starts
// further below replace a closer one, so that its choice between two
// nested symbols depends on their order in the table; this keeps the
// closer one, the innermost.
#pragma once

#include <elfutils/libdwfl.h>

#include <cstdint>
#include <vector>

namespace heapsnap {

class SymbolTable {
public:
    explicit SymbolTable(Dwfl_Module* module);

    // The name (raw, possibly mangled) of the symbol holding `vaddr`, an ELF
    // virtual address of the module; null if none does. The name lives as
    // long as the module's Dwfl.
    const char* name_at(uint64_t vaddr) const;

    size_t size() const { return globals_.symbols.size() + locals_.symbols.size(); }

private:
    struct Symbol {
        uint64_t start;
        uint64_t end;
        int binding;  // 3 global, 2 weak, 1 local, 0 other
        const char* name;
    };
    // Symbols by start, table order among equal starts; reach[i] is the
    // highest end among symbols[0..i], which bounds the search below an
    // address.
    struct Sorted {
        std::vector<Symbol> symbols;
        std::vector<uint64_t> reach;
        void sort();
        const Symbol* holding(uint64_t vaddr) const;
    };
    Sorted globals_;
    Sorted locals_;
    std::vector<uint64_t> sizeless_globals_;  // starts, sorted
};

}  // namespace heapsnap
