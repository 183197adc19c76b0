// Symbolizer tests against real ELF files: this test binary (built -O0 -g,
// so its functions, lines and inlining are known exactly), libstdc++ and
// libc as loaded into this process, and files that are missing or whose
// build-id does not match.
#include "symbolize/symbolizer.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "util/text.h"

// Functions with known names and lines to symbolize. External linkage, so
// GCC gives them a DW_AT_linkage_name, except file_local_helper().
// always_inline is honoured at -O0 too, so the inline helpers leave
// DW_TAG_inlined_subroutine entries in their callers.
// The k...Line constants count the lines above them: left as laid out.
// clang-format off
namespace symbolizer_fixture {

__attribute__((noinline)) uintptr_t return_address_here()
{
    return reinterpret_cast<uintptr_t>(__builtin_return_address(0));
}

inline __attribute__((always_inline)) uintptr_t inlined_leaf()
{
    return return_address_here();
}
constexpr uint32_t kCallInLeafLine = __LINE__ - 2;

inline __attribute__((always_inline)) uintptr_t inlined_helper()
{
    return inlined_leaf();
}
constexpr uint32_t kCallInHelperLine = __LINE__ - 2;

__attribute__((noinline)) uintptr_t outer_function()
{
    return inlined_helper();
}
constexpr uint32_t kCallInOuterLine = __LINE__ - 2;

static inline __attribute__((always_inline)) uintptr_t file_local_helper()
{
    return return_address_here();
}
constexpr uint32_t kCallInFileLocalLine = __LINE__ - 2;

__attribute__((noinline)) uintptr_t calls_file_local_helper()
{
    return file_local_helper();
}
constexpr uint32_t kCallOfFileLocalLine = __LINE__ - 2;

struct Widget {
    __attribute__((noinline)) uintptr_t poke(int times);
};

uintptr_t Widget::poke(int times)
{
    return times > 0 ? return_address_here() : 0;
}
constexpr uint32_t kCallInPokeLine = __LINE__ - 2;

}  // namespace symbolizer_fixture
// clang-format on

namespace {

using namespace symbolizer_fixture;

struct LoadedModule {
    heapsnap::ModuleRef ref;
    uintptr_t bias = 0;
};

std::string self_exe_path() {
    char path[PATH_MAX];
    ssize_t length = readlink("/proc/self/exe", path, sizeof path - 1);
    REQUIRE(length > 0);
    return std::string(path, length);
}

std::string build_id_from_notes(const dl_phdr_info& info, const ElfW(Phdr) & note_segment) {
    const size_t align = note_segment.p_align == 8 ? 8 : 4;
    auto aligned = [align](size_t n) { return (n + align - 1) & ~(align - 1); };
    const char* note = reinterpret_cast<const char*>(info.dlpi_addr + note_segment.p_vaddr);
    const char* end = note + note_segment.p_memsz;
    while (note + sizeof(ElfW(Nhdr)) <= end) {
        const auto* header = reinterpret_cast<const ElfW(Nhdr)*>(note);
        const char* name = note + sizeof(ElfW(Nhdr));
        const char* desc = name + aligned(header->n_namesz);
        if (header->n_type == NT_GNU_BUILD_ID && header->n_namesz == 4 && std::string(name) == "GNU")
            return std::string(desc, header->n_descsz);
        note = desc + aligned(header->n_descsz);
    }
    return {};
}

// What the recorder would have recorded for the module holding `address`:
// its path, load bias and in-memory build-id.
LoadedModule loaded_module_containing(const void* address) {
    struct Search {
        uintptr_t address;
        LoadedModule found;
        bool done = false;
    } search{reinterpret_cast<uintptr_t>(address), {}};
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* data) {
            auto& search = *static_cast<Search*>(data);
            bool contains = false;
            for (int i = 0; i < info->dlpi_phnum; ++i) {
                const ElfW(Phdr)& segment = info->dlpi_phdr[i];
                uintptr_t start = info->dlpi_addr + segment.p_vaddr;
                if (segment.p_type == PT_LOAD && search.address >= start && search.address < start + segment.p_memsz)
                    contains = true;
            }
            if (!contains) return 0;
            search.found.bias = info->dlpi_addr;
            search.found.ref.path = info->dlpi_name;
            for (int i = 0; i < info->dlpi_phnum && search.found.ref.build_id.empty(); ++i)
                if (info->dlpi_phdr[i].p_type == PT_NOTE)
                    search.found.ref.build_id = build_id_from_notes(*info, info->dlpi_phdr[i]);
            search.done = true;
            return 1;
        },
        &search);
    REQUIRE(search.done);
    if (search.found.ref.path.empty())
        search.found.ref.path = self_exe_path();  // the main program is listed without a name
    return search.found;
}

// A return address as a stack walker records it, turned into what callers
// of the Symbolizer pass: an ELF vaddr inside the call instruction.
uint64_t call_vaddr(const LoadedModule& module, uintptr_t return_address) { return return_address - module.bias - 1; }

// The library's own definition, not an interposer's (a sanitizer or a
// preloaded heap tracer would win a lookup through RTLD_DEFAULT).
void* symbol_in_loaded_library(const char* library, const char* symbol) {
    void* handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    REQUIRE(handle);
    void* address = dlsym(handle, symbol);
    dlclose(handle);
    return address;
}

// Overwrites the file with zeros in place: the same inode, size and
// modification time, so only a reader of its bytes can tell.
void zero_in_place(const std::string& path) {
    int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    struct stat st;
    REQUIRE(fstat(fd, &st) == 0);
    std::vector<char> zeros(static_cast<size_t>(st.st_size));
    REQUIRE(pwrite(fd, zeros.data(), zeros.size(), 0) == st.st_size);
    const struct timespec times[2] = {st.st_atim, st.st_mtim};
    REQUIRE(futimens(fd, times) == 0);
    close(fd);
}

std::vector<std::string> described(const std::vector<heapsnap::SymbolFrame>& frames) {
    std::vector<std::string> text;
    for (const auto& f : frames)
        text.push_back(f.function + "|" + f.file + "|" + std::to_string(f.line) + "|" + std::to_string(f.inlined) +
                       "|" + f.module + "|" + std::to_string(f.offset));
    return text;
}

bool has_separate_debuginfo(const std::string& build_id) {
    std::string id = heapsnap::hex_of(build_id);
    std::string path = "/usr/lib/debug/.build-id/" + id.substr(0, 2) + "/" + id.substr(2) + ".debug";
    struct stat info;
    return stat(path.c_str(), &info) == 0;
}

}  // namespace

TEST_CASE("symbolizer: inlined calls give the inlined callees, then the real function at the call site") {
    uintptr_t return_address = outer_function();
    LoadedModule self = loaded_module_containing(reinterpret_cast<void*>(return_address));
    REQUIRE(!self.ref.build_id.empty());
    heapsnap::Symbolizer symbolizer;

    const auto& frames = symbolizer.symbolize(self.ref, call_vaddr(self, return_address));

    REQUIRE(frames.size() == 3);
    CHECK(frames[0].function == "symbolizer_fixture::inlined_leaf()");
    CHECK(frames[0].inlined);
    CHECK(frames[0].line == kCallInLeafLine);
    CHECK(frames[1].function == "symbolizer_fixture::inlined_helper()");
    CHECK(frames[1].inlined);
    CHECK(frames[1].line == kCallInHelperLine);
    CHECK(frames[2].function == "symbolizer_fixture::outer_function()");
    CHECK(!frames[2].inlined);
    CHECK(frames[2].line == kCallInOuterLine);
    for (const auto& frame : frames) {
        CHECK(frame.file.starts_with("/"));
        CHECK(frame.file.ends_with("/tests/unit/symbolizer_test.cpp"));
        CHECK(frame.module == self.ref.path);
        CHECK(frame.offset == call_vaddr(self, return_address));
    }
    CHECK(symbolizer.warnings().empty());
}

// GCC records no linkage name for an inlined function with internal
// linkage and it has no symbol of its own, so only its bare DWARF name is
// known; the real function around it still gets its full name from the
// symbol table.
TEST_CASE("symbolizer: an inlined static function is named by its bare DWARF name") {
    uintptr_t return_address = calls_file_local_helper();
    LoadedModule self = loaded_module_containing(reinterpret_cast<void*>(return_address));
    heapsnap::Symbolizer symbolizer;

    const auto& frames = symbolizer.symbolize(self.ref, call_vaddr(self, return_address));

    REQUIRE(frames.size() == 2);
    CHECK(frames[0].function == "file_local_helper");
    CHECK(frames[0].inlined);
    CHECK(frames[0].line == kCallInFileLocalLine);
    CHECK(frames[1].function == "symbolizer_fixture::calls_file_local_helper()");
    CHECK(!frames[1].inlined);
    CHECK(frames[1].line == kCallOfFileLocalLine);
}

TEST_CASE("symbolizer: a plain call in a member function gives one frame with the full demangled name") {
    uintptr_t return_address = Widget().poke(1);
    LoadedModule self = loaded_module_containing(reinterpret_cast<void*>(return_address));
    heapsnap::Symbolizer symbolizer;

    const auto& frames = symbolizer.symbolize(self.ref, call_vaddr(self, return_address));

    REQUIRE(frames.size() == 1);
    CHECK(frames[0].function == "symbolizer_fixture::Widget::poke(int)");
    CHECK(!frames[0].inlined);
    CHECK(frames[0].file.starts_with("/"));
    CHECK(frames[0].file.ends_with("/tests/unit/symbolizer_test.cpp"));
    CHECK(frames[0].line == kCallInPokeLine);
}

TEST_CASE("symbolizer: results are cached per module and address") {
    uintptr_t return_address = outer_function();
    LoadedModule self = loaded_module_containing(reinterpret_cast<void*>(return_address));
    heapsnap::Symbolizer symbolizer;

    const auto& first = symbolizer.symbolize(self.ref, call_vaddr(self, return_address));
    const auto& again = symbolizer.symbolize(self.ref, call_vaddr(self, return_address));

    CHECK(&first == &again);
}

TEST_CASE("symbolizer: a build-id mismatch gives module+offset and one warning for the module") {
    uintptr_t return_address = outer_function();
    LoadedModule self = loaded_module_containing(reinterpret_cast<void*>(return_address));
    heapsnap::ModuleRef stale = self.ref;
    stale.build_id[0] = static_cast<char>(stale.build_id[0] ^ 0xff);
    heapsnap::Symbolizer symbolizer;

    const auto& frames = symbolizer.symbolize(stale, call_vaddr(self, return_address));
    symbolizer.symbolize(stale, call_vaddr(self, return_address) - 1);

    REQUIRE(frames.size() == 1);
    CHECK(frames[0].function.empty());
    CHECK(frames[0].file.empty());
    CHECK(frames[0].line == 0);
    CHECK(frames[0].module == self.ref.path);
    CHECK(frames[0].offset == call_vaddr(self, return_address));
    REQUIRE(symbolizer.warnings().size() == 1);
    CHECK(symbolizer.warnings()[0] == self.ref.path + ": build-id mismatch (recorded " +
                                          heapsnap::hex_of(stale.build_id) + ", on disk " +
                                          heapsnap::hex_of(self.ref.build_id) + "): showing module+offset");
}

TEST_CASE("symbolizer: a missing file gives module+offset and one warning for the module") {
    heapsnap::ModuleRef gone{"/nonexistent/heapsnap/libgone.so", ""};
    heapsnap::Symbolizer symbolizer;

    const auto& frames = symbolizer.symbolize(gone, 0x1234);
    symbolizer.symbolize(gone, 0x5678);

    REQUIRE(frames.size() == 1);
    CHECK(frames[0].function.empty());
    CHECK(frames[0].module == "/nonexistent/heapsnap/libgone.so");
    CHECK(frames[0].offset == 0x1234);
    REQUIRE(symbolizer.warnings().size() == 1);
    CHECK(symbolizer.warnings()[0] ==
          "/nonexistent/heapsnap/libgone.so: cannot open: No such file or directory: showing module+offset");
}

TEST_CASE("symbolizer: an address outside every symbol gives module+offset, never a neighbour's name") {
    LoadedModule self = loaded_module_containing(reinterpret_cast<void*>(&outer_function));
    heapsnap::Symbolizer symbolizer;

    const auto& frames = symbolizer.symbolize(self.ref, 0);
    symbolizer.symbolize(self.ref, 1);

    REQUIRE(frames.size() == 1);
    CHECK(frames[0].function.empty());
    CHECK(frames[0].offset == 0);
    REQUIRE(symbolizer.warnings().size() == 1);
    CHECK(symbolizer.warnings()[0] ==
          self.ref.path + ": no symbol for some addresses (first 0x0): showing module+offset");
}

TEST_CASE("symbolizer: C++ names in a library are demangled with their parameter types") {
    void* operator_new = symbol_in_loaded_library("libstdc++.so.6", "_Znwm");
    REQUIRE(operator_new);
    LoadedModule libstdcxx = loaded_module_containing(operator_new);
    REQUIRE(libstdcxx.ref.path.find("libstdc++") != std::string::npos);
    heapsnap::Symbolizer symbolizer;

    uint64_t inside_operator_new = reinterpret_cast<uintptr_t>(operator_new) - libstdcxx.bias + 4;

    const auto& frames = symbolizer.symbolize(libstdcxx.ref, inside_operator_new);

    REQUIRE(frames.size() >= 1);
    CHECK(frames.back().function == "operator new(unsigned long)");
    if (!has_separate_debuginfo(libstdcxx.ref.build_id)) {
        REQUIRE(frames.size() == 1);
        CHECK(frames[0].file.empty());
        CHECK(frames[0].line == 0);
    }
    CHECK(symbolizer.warnings().empty());
}

// libc's debug info is in a separate file found by build-id when libc6-dbg
// is installed; without it the stripped libc still names its exported
// symbols.
TEST_CASE("symbolizer: libc is named from separate debug info or from its symbol table") {
    void* malloc_entry = symbol_in_loaded_library("libc.so.6", "malloc");
    REQUIRE(malloc_entry);
    LoadedModule libc = loaded_module_containing(malloc_entry);
    REQUIRE(libc.ref.path.find("libc.so") != std::string::npos);
    heapsnap::Symbolizer symbolizer;

    uint64_t inside_malloc = reinterpret_cast<uintptr_t>(malloc_entry) - libc.bias + 4;

    const auto& frames = symbolizer.symbolize(libc.ref, inside_malloc);

    REQUIRE(frames.size() == 1);
    if (has_separate_debuginfo(libc.ref.build_id)) {
        CHECK(frames[0].function == "__libc_malloc");
        CHECK(frames[0].file.ends_with("/malloc/malloc.c"));
        CHECK(frames[0].line > 0);
    } else {
        CHECK(frames[0].function == "malloc");
        CHECK(frames[0].file.empty());
        CHECK(frames[0].line == 0);
    }
    CHECK(symbolizer.warnings().empty());
}

// The cache is tested on a copy of this test binary, which can be damaged
// after the first run to show that the second never reads it: the copy,
// the address of a call in outer_function() in it, and a cache directory.
struct CopyOfSelf {
    heapsnap::test::TempDir dir;
    uintptr_t return_address = outer_function();
    LoadedModule self = loaded_module_containing(reinterpret_cast<void*>(return_address));
    heapsnap::ModuleRef copy{dir.path + "/copy", self.ref.build_id};
    uint64_t vaddr = call_vaddr(self, return_address);
    std::string cache = dir.path + "/cache";

    CopyOfSelf() { std::filesystem::copy_file(self.ref.path, copy.path); }
};

TEST_CASE("symbolizer: with a cache, a second run gives the same frames and warnings without opening the module") {
    CopyOfSelf c;
    std::vector<std::string> first;
    std::vector<std::string> warnings;
    {
        heapsnap::Symbolizer symbolizer(c.cache);
        first = described(symbolizer.symbolize(c.copy, c.vaddr));
        symbolizer.symbolize(c.copy, 0);
        warnings = symbolizer.warnings();
    }
    REQUIRE(first.size() == 3);
    CHECK(first[2].starts_with("symbolizer_fixture::outer_function()|/"));
    CHECK(warnings ==
          std::vector<std::string>{c.copy.path + ": no symbol for some addresses (first 0x0): showing module+offset"});
    struct stat st;
    REQUIRE(stat(c.cache.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0700);
    zero_in_place(c.copy.path);

    heapsnap::Symbolizer cached(c.cache);
    CHECK(described(cached.symbolize(c.copy, c.vaddr)) == first);
    cached.symbolize(c.copy, 0);
    CHECK(cached.warnings() == warnings);
    heapsnap::Symbolizer uncached;
    CHECK(uncached.symbolize(c.copy, c.vaddr).back().function.empty());
    REQUIRE(uncached.warnings().size() == 1);
    CHECK(uncached.warnings()[0] == c.copy.path + ": cannot open: not a valid ELF file: showing module+offset");
}

TEST_CASE("symbolizer: a module file replaced since it was cached is opened again") {
    CopyOfSelf c;
    { heapsnap::Symbolizer(c.cache).symbolize(c.copy, c.vaddr); }
    // Another file at the path (another inode): its build-id is checked.
    std::filesystem::remove(c.copy.path);
    std::filesystem::copy_file("/bin/sh", c.copy.path);

    heapsnap::Symbolizer symbolizer(c.cache);
    const auto& frames = symbolizer.symbolize(c.copy, c.vaddr);

    REQUIRE(frames.size() == 1);
    CHECK(frames[0].function.empty());
    REQUIRE(symbolizer.warnings().size() == 1);
    CHECK(symbolizer.warnings()[0].starts_with(c.copy.path + ": build-id mismatch (recorded " +
                                               heapsnap::hex_of(c.copy.build_id)));
}

TEST_CASE("symbolizer: only a module whose recorded build-id matched is cached") {
    CopyOfSelf c;
    heapsnap::ModuleRef unknown{c.copy.path, ""};
    heapsnap::ModuleRef stale = c.copy;
    stale.build_id[0] = static_cast<char>(stale.build_id[0] ^ 0xff);
    {
        heapsnap::Symbolizer symbolizer(c.cache);
        symbolizer.symbolize(unknown, c.vaddr);
        symbolizer.symbolize(stale, c.vaddr);
    }
    CHECK(std::filesystem::is_empty(c.cache));
}
