// See symbol_table.h for why and for the rules it keeps.
#include "symbolize/symbol_table.h"

#include <gelf.h>

#include <algorithm>

namespace heapsnap {

namespace {

int binding_rank(const GElf_Sym& symbol) {
    switch (GELF_ST_BIND(symbol.st_info)) {
        case STB_GLOBAL: return 3;
        case STB_WEAK: return 2;
        case STB_LOCAL: return 1;
        default: return 0;
    }
}

bool may_name_code(const char* name, const GElf_Sym& symbol) {
    int type = GELF_ST_TYPE(symbol.st_info);
    return name && name[0] && symbol.st_shndx != SHN_UNDEF && type != STT_SECTION && type != STT_FILE &&
           type != STT_TLS;
}

}  // namespace

SymbolTable::SymbolTable(Dwfl_Module* module) {
    int count = dwfl_module_getsymtab(module);
    int first_global = dwfl_module_getsymtab_first_global(module);
    if (count <= 0 || first_global < 0) return;
    // Index 0 is the null symbol. A table of .dynsym read through the
    // program headers has no local part: first_global is then 0.
    for (int i = 1; i < count; ++i) {
        GElf_Sym symbol;
        GElf_Addr start = 0;
        const char* name = dwfl_module_getsym_info(module, i, &symbol, &start, nullptr, nullptr, nullptr);
        if (!may_name_code(name, symbol)) continue;
        bool global = first_global == 0 || i >= first_global;
        if (symbol.st_size == 0) {
            if (global) sizeless_globals_.push_back(start);
            continue;
        }
        Symbol entry{start, start + symbol.st_size, binding_rank(symbol), name};
        (global ? globals_ : locals_).symbols.push_back(entry);
    }
    globals_.sort();
    locals_.sort();
    std::sort(sizeless_globals_.begin(), sizeless_globals_.end());
}

void SymbolTable::Sorted::sort() {
    std::stable_sort(symbols.begin(), symbols.end(),
                     [](const Symbol& a, const Symbol& b) { return a.start < b.start; });
    reach.resize(symbols.size());
    uint64_t highest = 0;
    for (size_t i = 0; i < symbols.size(); ++i) {
        highest = std::max(highest, symbols[i].end);
        reach[i] = highest;
    }
}

const SymbolTable::Symbol* SymbolTable::Sorted::holding(uint64_t vaddr) const {
    auto above = std::upper_bound(symbols.begin(), symbols.end(), vaddr,
                                  [](uint64_t address, const Symbol& s) { return address < s.start; });
    // The closest start below with a symbol holding the address; no symbol
    // before an index whose reach is at or below the address can hold it.
    size_t i = static_cast<size_t>(above - symbols.begin());
    while (i > 0 && reach[i - 1] > vaddr && symbols[i - 1].end <= vaddr) --i;
    if (i == 0 || reach[i - 1] <= vaddr) return nullptr;
    uint64_t start = symbols[i - 1].start;
    // Those starting there, in table order.
    auto first = std::lower_bound(symbols.begin(), symbols.begin() + static_cast<std::ptrdiff_t>(i), start,
                                  [](const Symbol& s, uint64_t address) { return s.start < address; });
    const Symbol* best = nullptr;
    for (auto it = first; it != symbols.begin() + static_cast<std::ptrdiff_t>(i); ++it) {
        if (it->end <= vaddr) continue;
        bool smaller = best && it->end < best->end;
        if (!best || it->binding > best->binding || (it->binding == best->binding && smaller)) best = &*it;
    }
    return best;
}

const char* SymbolTable::name_at(uint64_t vaddr) const {
    if (const Symbol* global = globals_.holding(vaddr)) return global->name;
    if (std::binary_search(sizeless_globals_.begin(), sizeless_globals_.end(), vaddr)) return nullptr;
    const Symbol* local = locals_.holding(vaddr);
    return local ? local->name : nullptr;
}

}  // namespace heapsnap
