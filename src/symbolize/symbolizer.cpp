// See symbolizer.h for why symbolization is per module, by ELF vaddr, and
// never guesses a name.
#include "symbolize/symbolizer.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#include <gelf.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <vector>
#include <unordered_map>
#include <utility>

#include "symbolize/debug_sources.h"
#include "symbolize/symbol_cache.h"
#include "symbolize/symbol_table.h"
#include "util/text.h"

namespace heapsnap {

namespace {

const char kFallbackNote[] = ": showing module+offset";

// Null means libdwfl's default path, which includes /usr/lib/debug, so
// separate debug files are found by build-id and by .gnu_debuglink.
char* g_debuginfo_path = nullptr;

const Dwfl_Callbacks kOfflineCallbacks = {
    .find_elf = dwfl_build_id_find_elf,
    .find_debuginfo = dwfl_standard_find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &g_debuginfo_path,
};

struct DwflDeleter {
    void operator()(Dwfl* dwfl) const { dwfl_end(dwfl); }
};
using DwflHandle = std::unique_ptr<Dwfl, DwflDeleter>;

// Only "_Z" names are mangled: __cxa_demangle would also "demangle" a plain
// C name such as "f" into the type "float".
bool is_mangled(const char* name) { return name && name[0] == '_' && name[1] == 'Z'; }

std::string demangle(const char* name) {
    if (!is_mangled(name)) return name;
    int status = 0;
    char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status != 0 || !demangled) return name;
    std::string result = demangled;
    std::free(demangled);
    return result;
}

// libdw already joins a file with its directory entry, and the first entry
// is the comp_dir, so a file is still relative only when the comp_dir was
// relative too (Debian's -fdebug-prefix-map builds: "./malloc/malloc.c"
// with comp_dir "./malloc"); joining again would give a path that does not
// exist. An absolute comp_dir is still applied to a relative file in case
// the line table did not.
// "/a/build/../src/x.c" -> "/a/src/x.c": lexically, as the compiler saw
// it (no symlinks resolved: the file may not exist here).
std::string normalized(const std::string& path) {
    std::vector<std::string> parts;
    size_t start = 1;
    while (start <= path.size()) {
        size_t slash = path.find('/', start);
        if (slash == std::string::npos) slash = path.size();
        std::string part = path.substr(start, slash - start);
        if (part == "..") {
            if (!parts.empty()) parts.pop_back();
        } else if (!part.empty() && part != ".") {
            parts.push_back(part);
        }
        start = slash + 1;
    }
    std::string out;
    for (const std::string& part : parts) out += "/" + part;
    return out.empty() ? "/" : out;
}

std::string absolute_path(const char* file, const char* comp_dir) {
    if (file[0] == '/') return normalized(file);
    if (!comp_dir || comp_dir[0] != '/') return file;
    return normalized(std::string(comp_dir) + "/" + file);
}

const char* string_attribute(Dwarf_Die* die, unsigned int name) {
    Dwarf_Attribute attribute;
    return dwarf_formstring(dwarf_attr_integrate(die, name, &attribute));
}

// dwarf_attr_integrate follows DW_AT_abstract_origin (inlined and
// out-of-line instances) and DW_AT_specification (member functions defined
// outside their class), where the names live. A C linkage name that is not
// mangled (glibc's "__GI___libc_malloc" asm labels) is an internal alias,
// not the name the source uses.
const char* dwarf_mangled_name(Dwarf_Die* function) {
    for (unsigned int attribute : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
        const char* name = string_attribute(function, attribute);
        if (is_mangled(name)) return name;
    }
    return nullptr;
}

std::string inlined_function_name(Dwarf_Die* inlined_call) {
    if (const char* mangled = dwarf_mangled_name(inlined_call)) return demangle(mangled);
    const char* name = string_attribute(inlined_call, DW_AT_name);
    return name ? name : "";
}

// Only a symbol whose recorded size covers the address (symbol_table.h):
// the nearest preceding symbol of a sizeless or too-short one may be an
// unrelated function. Returns the raw (possibly mangled) name.
std::string elf_symbol_name(const SymbolTable& symbols, uint64_t vaddr) {
    const char* name = symbols.name_at(vaddr);
    return name ? name : "";
}

// Mangled names first, because they carry namespaces and parameter types:
// GCC gives no DW_AT_linkage_name to functions with internal linkage
// (static, anonymous namespace), but the symbol table still has their
// mangled name. A plain DWARF name beats a plain ELF symbol, which may be
// any of several aliases of a C function.
std::string real_function_name(const SymbolTable& symbols, uint64_t vaddr, Dwarf_Die* subprogram) {
    if (const char* mangled = subprogram ? dwarf_mangled_name(subprogram) : nullptr) return demangle(mangled);
    std::string symbol = elf_symbol_name(symbols, vaddr);
    const char* dwarf_name = subprogram ? string_attribute(subprogram, DW_AT_name) : nullptr;
    if (is_mangled(symbol.c_str()) || !dwarf_name) return demangle(symbol.c_str());
    return dwarf_name;
}

// The innermost frame's location comes from the line table.
void set_line_table_location(Dwfl_Module* module, uint64_t vaddr, SymbolFrame& frame) {
    Dwfl_Line* line = dwfl_module_getsrc(module, vaddr);
    int line_number = 0;
    const char* file = line ? dwfl_lineinfo(line, nullptr, &line_number, nullptr, nullptr, nullptr) : nullptr;
    if (!file || line_number <= 0) return;
    frame.file = absolute_path(file, dwfl_line_comp_dir(line));
    frame.line = static_cast<uint32_t>(line_number);
}

// An inlined call's DW_AT_call_file/DW_AT_call_line is where the next outer
// frame stands.
void set_call_site_location(Dwarf_Die* inlined_call, SymbolFrame& outer) {
    Dwarf_Attribute attribute;
    Dwarf_Word file_index = 0;
    Dwarf_Word line = 0;
    if (dwarf_formudata(dwarf_attr(inlined_call, DW_AT_call_file, &attribute), &file_index) != 0 ||
        dwarf_formudata(dwarf_attr(inlined_call, DW_AT_call_line, &attribute), &line) != 0)
        return;
    Dwarf_Die cu;
    Dwarf_Files* files = nullptr;
    size_t file_count = 0;
    if (!dwarf_diecu(inlined_call, &cu, nullptr, nullptr) || dwarf_getsrcfiles(&cu, &files, &file_count) != 0 ||
        file_index >= file_count)
        return;
    const char* file = dwarf_filesrc(files, file_index, nullptr, nullptr);
    if (!file) return;
    outer.file = absolute_path(file, string_attribute(&cu, DW_AT_comp_dir));
    outer.line = static_cast<uint32_t>(line);
}

// The DIEs that contain the address, innermost first, following the
// concrete tree. dwarf_getscopes alone will not do: past an inlined
// subroutine it continues with the scopes of the inlined function's
// abstract definition (its namespace, the CU), not with its caller.
std::vector<Dwarf_Die> scopes_at(Dwfl_Module* module, uint64_t vaddr) {
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dwfl_module_addrdie(module, vaddr, &bias);
    Dwarf_Die* scopes = nullptr;
    int count = cu ? dwarf_getscopes(cu, vaddr - bias, &scopes) : 0;
    if (count <= 0) {
        std::free(scopes);
        return {};
    }
    Dwarf_Die innermost = scopes[0];
    std::free(scopes);
    scopes = nullptr;
    count = dwarf_getscopes_die(&innermost, &scopes);
    std::vector<Dwarf_Die> chain(scopes, scopes + std::max(count, 0));
    std::free(scopes);
    return chain;
}

// Each inlined subroutine around the address names frames.back() and opens
// a new outer frame at its call site. Stops at the real function, returned
// through `subprogram`; false if the address is not inside one in DWARF.
bool add_inlined_frames(Dwfl_Module* module, uint64_t vaddr, std::vector<SymbolFrame>& frames, Dwarf_Die& subprogram) {
    for (Dwarf_Die& scope : scopes_at(module, vaddr)) {
        int tag = dwarf_tag(&scope);
        if (tag == DW_TAG_subprogram) {
            subprogram = scope;
            return true;
        }
        if (tag != DW_TAG_inlined_subroutine) continue;
        frames.back().function = inlined_function_name(&scope);
        frames.back().inlined = true;
        frames.emplace_back();
        set_call_site_location(&scope, frames.back());
    }
    return false;
}

// Return addresses only ever point into code. Anything else (address 0,
// data) could still hit DWARF left behind for functions the linker
// discarded, whose ranges start at 0: such an address gets no name.
bool in_executable_segment(Dwfl_Module* module, uint64_t vaddr) {
    GElf_Addr bias = 0;
    Elf* elf = dwfl_module_getelf(module, &bias);
    size_t count = 0;
    if (!elf || elf_getphdrnum(elf, &count) != 0) return false;
    for (size_t i = 0; i < count; ++i) {
        GElf_Phdr header;
        if (!gelf_getphdr(elf, static_cast<int>(i), &header)) continue;
        uint64_t start = header.p_vaddr + bias;
        if (header.p_type == PT_LOAD && (header.p_flags & PF_X) && vaddr >= start && vaddr < start + header.p_memsz)
            return true;
    }
    return false;
}

// frames.back() is always the real function; DWARF adds the inlined frames
// in front of it where there are any.
std::vector<SymbolFrame> resolve(Dwfl_Module* module, const SymbolTable& symbols, uint64_t vaddr) {
    std::vector<SymbolFrame> frames(1);
    if (!in_executable_segment(module, vaddr)) return frames;
    set_line_table_location(module, vaddr, frames[0]);
    Dwarf_Die subprogram;
    bool in_subprogram = add_inlined_frames(module, vaddr, frames, subprogram);
    frames.back().function = real_function_name(symbols, vaddr, in_subprogram ? &subprogram : nullptr);
    return frames;
}

std::string dwfl_error() {
    const char* message = dwfl_errmsg(-1);
    return message ? message : "unknown libdwfl error";
}

}  // namespace

struct Symbolizer::Impl {
    struct Module {
        bool opened = false;  // open() ran: libdwfl was asked
        DwflHandle dwfl;
        Dwfl_Module* elf = nullptr;          // null: unusable, every address is module+offset
        std::optional<SymbolTable> symbols;  // of elf
        FileIdentity file;                   // the module file as opened
        bool warned_no_symbol = false;
        std::unordered_map<uint64_t, std::vector<SymbolFrame>> frames_by_vaddr;
        // The cache's frames and this run's lookups, to be written back
        // when `looked_up` says there are new ones.
        std::optional<ModuleSymbols> cached;
        bool looked_up = false;
    };

    std::optional<SymbolCache> cache;
    std::map<std::pair<std::string, std::string>, Module> modules;
    std::vector<std::string> warnings;

    Module& module_for(const ModuleRef& ref);
    void open(const ModuleRef& ref, Module& module);
    bool build_id_matches(const ModuleRef& ref, Dwfl_Module* elf);
    std::vector<SymbolFrame> lookup(const ModuleRef& ref, Module& module, uint64_t vaddr);
    void save_cache();
};

// A module the cache answers for is opened only when an address misses.
Symbolizer::Impl::Module& Symbolizer::Impl::module_for(const ModuleRef& ref) {
    auto [it, inserted] = modules.try_emplace({ref.path, ref.build_id});
    if (inserted && cache) it->second.cached = cache->load(ref);
    return it->second;
}

// Base 0 and no p_vaddr adjustment: the module's addresses are the ELF
// file's own vaddrs, which is what callers pass.
void Symbolizer::Impl::open(const ModuleRef& ref, Module& module) {
    module.opened = true;
    module.dwfl.reset(dwfl_begin(&kOfflineCallbacks));
    if (!module.dwfl) {
        warnings.push_back(ref.path + ": cannot start libdwfl: " + dwfl_error() + kFallbackNote);
        return;
    }
    // Opened here, not by libdwfl: a path from a log or snapshot may name a
    // FIFO or a device (a hostile file, or a path reused since), whose
    // open() or read() would block forever. Only regular files are ELF.
    int fd = ::open(ref.path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        std::string why = fd < 0 ? std::strerror(errno) : "not a regular file";
        if (fd >= 0) ::close(fd);
        warnings.push_back(ref.path + ": cannot open: " + why + kFallbackNote);
        return;
    }
    module.file = identity_of(fd, ref.path);
    Dwfl_Module* elf = dwfl_report_elf(module.dwfl.get(), ref.path.c_str(), ref.path.c_str(), fd, 0, false);
    if (!elf) {
        ::close(fd);  // libdwfl takes the descriptor only when it succeeds
        warnings.push_back(ref.path + ": cannot open: " + dwfl_error() + kFallbackNote);
        return;
    }
    dwfl_report_end(module.dwfl.get(), nullptr, nullptr);
    if (build_id_matches(ref, elf)) {
        module.elf = elf;
        module.symbols.emplace(elf);
    }
}

bool Symbolizer::Impl::build_id_matches(const ModuleRef& ref, Dwfl_Module* elf) {
    if (ref.build_id.empty()) return true;
    const unsigned char* bits = nullptr;
    GElf_Addr note_vaddr = 0;
    int length = dwfl_module_build_id(elf, &bits, &note_vaddr);
    std::string on_disk = length > 0 ? std::string(reinterpret_cast<const char*>(bits), length) : "";
    if (on_disk == ref.build_id) return true;
    warnings.push_back(ref.path + ": build-id mismatch (recorded " + hex_of(ref.build_id) + ", on disk " +
                       (on_disk.empty() ? "none" : hex_of(on_disk)) + ")" + kFallbackNote);
    return false;
}

// From the cache, or from libdwfl (then kept for the cache, if the
// module's build-id was recorded and matched). Either way, the first
// address without a name is reported once.
std::vector<SymbolFrame> Symbolizer::Impl::lookup(const ModuleRef& ref, Module& module, uint64_t vaddr) {
    std::vector<SymbolFrame> frames;
    bool named_by_module = true;
    if (!module.cached || !module.cached->find(vaddr, frames)) {
        if (!module.opened) open(ref, module);
        named_by_module = module.elf != nullptr;
        frames = module.elf ? resolve(module.elf, *module.symbols, vaddr) : std::vector<SymbolFrame>(1);
        if (cache && module.elf && !ref.build_id.empty()) {
            if (!module.cached) module.cached.emplace();
            module.looked_up |= module.cached->add(vaddr, frames);
        }
    }
    if (named_by_module && frames.back().function.empty() && !module.warned_no_symbol) {
        module.warned_no_symbol = true;
        char first[32];
        std::snprintf(first, sizeof first, "0x%llx", static_cast<unsigned long long>(vaddr));
        warnings.push_back(ref.path + ": no symbol for some addresses (first " + first + ")" + kFallbackNote);
    }
    for (SymbolFrame& frame : frames) {
        frame.module = ref.path;
        frame.offset = vaddr;
    }
    return frames;
}

void Symbolizer::Impl::save_cache() {
    for (auto& [key, module] : modules) {
        if (!module.looked_up) continue;
        Dwarf_Addr bias = 0;
        module.cached->has_dwarf = dwfl_module_getdwarf(module.elf, &bias) != nullptr;
        module.cached->sources = debug_sources(module.elf, module.file);
        cache->save(ModuleRef{key.first, key.second}, *module.cached);
    }
}

Symbolizer::Symbolizer() : impl_(std::make_unique<Impl>()) {}

Symbolizer::Symbolizer(const std::string& cache_dir) : Symbolizer() {
    if (!cache_dir.empty()) impl_->cache.emplace(cache_dir);
}

Symbolizer::~Symbolizer() {
    if (!impl_->cache) return;
    try {
        impl_->save_cache();
    } catch (const std::exception&) {
        // A cache that cannot be written costs speed, not results.
    }
}

const std::vector<SymbolFrame>& Symbolizer::symbolize(const ModuleRef& module, uint64_t vaddr) {
    Impl::Module& state = impl_->module_for(module);
    auto it = state.frames_by_vaddr.find(vaddr);
    if (it == state.frames_by_vaddr.end())
        it = state.frames_by_vaddr.emplace(vaddr, impl_->lookup(module, state, vaddr)).first;
    return it->second;
}

const std::vector<std::string>& Symbolizer::warnings() const { return impl_->warnings; }

}  // namespace heapsnap
