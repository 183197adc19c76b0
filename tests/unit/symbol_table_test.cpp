// The symbol table against dwfl_module_addrinfo, which it replaced in the
// symbolizer: on real modules (this test binary with its local symbols,
// libc, libstdc++, libdw), at the first, middle and last byte of sized
// symbols and the byte before each, both name the same symbol or none.
#include "symbolize/symbol_table.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gelf.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <climits>
#include <cstdlib>
#include <exception>
#include <string>

namespace {

char* g_debuginfo_path = nullptr;

const Dwfl_Callbacks kCallbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &g_debuginfo_path,
};

// The module at `path`, reported at base 0 as the symbolizer reports it.
struct Opened {
    Dwfl* dwfl = nullptr;
    Dwfl_Module* module = nullptr;

    explicit Opened(const std::string& path) {
        dwfl = dwfl_begin(&kCallbacks);
        REQUIRE(dwfl);
        int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
        REQUIRE(fd >= 0);
        module = dwfl_report_elf(dwfl, path.c_str(), path.c_str(), fd, 0, false);
        REQUIRE(module);
        dwfl_report_end(dwfl, nullptr, nullptr);
    }
    ~Opened() { dwfl_end(dwfl); }
    Opened(const Opened&) = delete;
    Opened& operator=(const Opened&) = delete;
};

// What the symbolizer took from libdwfl before: dwfl_module_addrinfo's
// symbol, if it has a size and holds the address.
std::string libdwfl_name(Dwfl_Module* module, uint64_t vaddr) {
    GElf_Off offset = 0;
    GElf_Sym symbol;
    const char* name = dwfl_module_addrinfo(module, vaddr, &offset, &symbol, nullptr, nullptr, nullptr);
    if (!name || symbol.st_size == 0 || offset >= symbol.st_size) return "";
    return name;
}

std::string table_name(const heapsnap::SymbolTable& table, uint64_t vaddr) {
    const char* name = table.name_at(vaddr);
    return name ? name : "";
}

std::string path_of(const void* address) {
    Dl_info info;
    REQUIRE(dladdr(address, &info) != 0);
    REQUIRE(info.dli_fname);
    return info.dli_fname;
}

std::string self_path() {
    char path[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
    REQUIRE(length > 0);
    return std::string(path, static_cast<size_t>(length));
}

// About 600 symbols a module: dwfl_module_addrinfo reads the whole table
// on every call.
void check_same_names(const std::string& path) {
    CAPTURE(path);
    Opened opened(path);
    heapsnap::SymbolTable table(opened.module);
    int count = dwfl_module_getsymtab(opened.module);
    REQUIRE(count > 1);
    int stride = count / 600 + 1;
    int compared = 0;
    int named = 0;
    for (int i = 1; i < count; i += stride) {
        GElf_Sym symbol;
        GElf_Addr start = 0;
        const char* name = dwfl_module_getsym_info(opened.module, i, &symbol, &start, nullptr, nullptr, nullptr);
        if (!name || symbol.st_size == 0 || GELF_ST_TYPE(symbol.st_info) != STT_FUNC) continue;
        for (uint64_t vaddr : {start - 1, start, start + symbol.st_size / 2, start + symbol.st_size - 1}) {
            CAPTURE(vaddr);
            std::string expected = libdwfl_name(opened.module, vaddr);
            CHECK(table_name(table, vaddr) == expected);
            ++compared;
            named += !expected.empty();
        }
    }
    CHECK(compared >= 400);
    CHECK(named > compared / 2);
}

}  // namespace

TEST_CASE("symbol table: names what dwfl_module_addrinfo names, in this binary, libc, libstdc++ and libdw") {
    check_same_names(self_path());
    check_same_names(path_of(reinterpret_cast<const void*>(&malloc)));
    check_same_names(path_of(reinterpret_cast<const void*>(&std::terminate)));
    check_same_names(path_of(reinterpret_cast<const void*>(&dwfl_begin)));
}

TEST_CASE("symbol table: an address past every symbol, or in none, has no name") {
    Opened opened(self_path());
    heapsnap::SymbolTable table(opened.module);
    REQUIRE(table.size() > 100);
    CHECK(table.name_at(0) == nullptr);
    CHECK(table.name_at(UINT64_MAX) == nullptr);
}
