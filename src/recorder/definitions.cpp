#include "recorder/definitions.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>

#include <cstdint>

namespace heapsnap::recorder {
namespace {

// What a module's dynamic section says about its dynamic symbols. The
// dynamic linker has made the addresses in it absolute (but in the vDSO,
// which is never searched).
struct Symbols {
    uint64_t base = 0;
    const ElfW(Sym) * symtab = nullptr;
    const char* strtab = nullptr;
    const uint32_t* gnu_hash = nullptr;
    const uint32_t* sysv_hash = nullptr;
    const ElfW(Versym) * versym = nullptr;
};

template <class T>
const T* dyn_pointer(uint64_t value, uint64_t base) {
    return reinterpret_cast<const T*>(value < base ? value + base : value);
}

Symbols symbols_of(uint64_t base, const ElfW(Dyn) * d) {
    Symbols s;
    s.base = base;
    for (; d && d->d_tag != DT_NULL; ++d) {
        switch (d->d_tag) {
            case DT_SYMTAB: s.symtab = dyn_pointer<ElfW(Sym)>(d->d_un.d_ptr, base); break;
            case DT_STRTAB: s.strtab = dyn_pointer<char>(d->d_un.d_ptr, base); break;
            case DT_GNU_HASH: s.gnu_hash = dyn_pointer<uint32_t>(d->d_un.d_ptr, base); break;
            case DT_HASH: s.sysv_hash = dyn_pointer<uint32_t>(d->d_un.d_ptr, base); break;
            case DT_VERSYM: s.versym = dyn_pointer<ElfW(Versym)>(d->d_un.d_ptr, base); break;
            default: break;
        }
    }
    return s;
}

// Symbol i defines function `name`, in its default version (a hidden
// version, bit 15 of its version index, is an older ABI's alias).
bool defines(const Symbols& s, uint32_t i, const char* name) {
    const ElfW(Sym)& sym = s.symtab[i];
    int type = ELF64_ST_TYPE(sym.st_info);
    int bind = ELF64_ST_BIND(sym.st_info);
    if (sym.st_shndx == SHN_UNDEF || sym.st_value == 0) return false;
    if ((type != STT_FUNC && type != STT_GNU_IFUNC) || (bind != STB_GLOBAL && bind != STB_WEAK)) return false;
    if (s.versym && (s.versym[i] & 0x8000)) return false;
    return strcmp(s.strtab + sym.st_name, name) == 0;
}

// The module's definition of `name`, through its hash table, or null.
const ElfW(Sym) * find_defined(const Symbols& s, const char* name) {
    if (!s.symtab || !s.strtab) return nullptr;
    if (s.gnu_hash) {
        uint32_t h = 5381;
        for (const char* c = name; *c; ++c) h = h * 33 + static_cast<uint8_t>(*c);
        uint32_t nbuckets = s.gnu_hash[0], symoffset = s.gnu_hash[1], bloom_words = s.gnu_hash[2];
        if (!nbuckets) return nullptr;
        const uint32_t* buckets = s.gnu_hash + 4 + bloom_words * (sizeof(ElfW(Addr)) / sizeof(uint32_t));
        const uint32_t* chain = buckets + nbuckets;
        uint32_t i = buckets[h % nbuckets];
        if (i < symoffset) return nullptr;
        for (;; ++i) {
            uint32_t link = chain[i - symoffset];
            if ((link | 1) == (h | 1) && defines(s, i, name)) return &s.symtab[i];
            if (link & 1) return nullptr;
        }
    }
    if (s.sysv_hash) {
        uint32_t h = 0;
        for (const char* c = name; *c; ++c) {
            h = (h << 4) + static_cast<uint8_t>(*c);
            h ^= (h >> 24) & 0xf0;
        }
        h &= 0x0fffffff;
        uint32_t nbucket = s.sysv_hash[0];
        if (!nbucket) return nullptr;
        const uint32_t* bucket = s.sysv_hash + 2;
        const uint32_t* chain = bucket + nbucket;
        for (uint32_t i = bucket[h % nbucket]; i; i = chain[i])
            if (defines(s, i, name)) return &s.symtab[i];
    }
    return nullptr;
}

void* address_of(const Symbols& s, const ElfW(Sym) * sym) {
    void* p = reinterpret_cast<void*>(s.base + sym->st_value);
    if (ELF64_ST_TYPE(sym->st_info) == STT_GNU_IFUNC) p = reinterpret_cast<void* (*)()>(p)();
    return p;
}

struct Range {
    uint64_t start = 0, end = 0;
};

Range object_at(const void* p) {
    dl_find_object found;
    if (_dl_find_object(const_cast<void*>(p), &found) != 0) return {};
    return Range{reinterpret_cast<uint64_t>(found.dlfo_map_start), reinterpret_cast<uint64_t>(found.dlfo_map_end)};
}

Range self_range() { return object_at(reinterpret_cast<const void*>(&in_recorder)); }

struct Search {
    const char* name;
    uint64_t self_start, loader_start;
    void* found;
};

int search_module(dl_phdr_info* info, size_t, void* data) {
    auto* search = static_cast<Search*>(data);
    if (info->dlpi_name && strstr(info->dlpi_name, "linux-vdso")) return 0;
    const ElfW(Dyn)* dynamic = nullptr;
    for (int i = 0; i < info->dlpi_phnum; ++i)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dynamic = reinterpret_cast<const ElfW(Dyn)*>(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dynamic) return 0;
    uint64_t start = object_at(dynamic).start;
    if (start == search->self_start || start == search->loader_start) return 0;
    Symbols s = symbols_of(info->dlpi_addr, dynamic);
    const ElfW(Sym)* sym = find_defined(s, search->name);
    if (!sym) return 0;
    search->found = address_of(s, sym);
    return 1;
}

}  // namespace

bool in_recorder(const void* p) {
    Range self = self_range();
    auto at = reinterpret_cast<uint64_t>(p);
    return at >= self.start && at < self.end;
}

void* definition_of(const char* name, void* candidate) {
    Range self = self_range();
    if (candidate && !in_recorder(candidate)) {
        dl_find_object found;
        if (_dl_find_object(candidate, &found) == 0 && found.dlfo_link_map) {
            const link_map* map = found.dlfo_link_map;
            Symbols s = symbols_of(map->l_addr, map->l_ld);
            const ElfW(Sym)* sym = find_defined(s, name);
            if (sym && (ELF64_ST_TYPE(sym->st_info) == STT_GNU_IFUNC ||
                        reinterpret_cast<void*>(s.base + sym->st_value) == candidate))
                return candidate;
        }
    }
    Search search{name, self.start, object_at(static_cast<const void*>(&_r_debug)).start, nullptr};
    dl_iterate_phdr(search_module, &search);
    return search.found;
}

}  // namespace heapsnap::recorder
