#include "recorder/attach.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "recorder/definitions.h"
#include "recorder/lifecycle.h"
#include "recorder/raw_alloc.h"
#include "recorder/spinlock.h"
#include "recorder/writer.h"

#define HEAPSNAP_EXPORT extern "C" __attribute__((visibility("default")))

namespace heapsnap::recorder {
namespace {

// The functions whose GOT slots are rewritten: every function hooks.cpp
// defines for LD_PRELOAD to bind, and dlopen (attached_dlopen).
constexpr const char* kHooked[] = {
    "malloc",    "free",     "calloc",    "realloc", "reallocarray", "memalign",   "posix_memalign", "aligned_alloc",
    "valloc",    "pvalloc",  "mmap",      "mmap64",  "munmap",       "mremap",     "pthread_create", "fork",
    "daemon",    "execve",   "execv",     "execvp",  "execvpe",      "fexecve",    "execveat",       "execl",
    "execlp",    "execle",   "_exit",     "_Exit",   "dlclose",      "dlopen",     "close",          "close_range",
    "closefrom", "dup2",     "dup3",      "prlimit", "prlimit64",    "setrlimit",  "setrlimit64",    "setuid",
    "seteuid",   "setreuid", "setresuid", "longjmp", "_longjmp",     "siglongjmp", "__longjmp_chk"};
constexpr size_t kHookCount = sizeof kHooked / sizeof kHooked[0];

uint32_t name_hash(const char* s) {
    uint32_t h = 2166136261u;
    for (; *s; ++s) h = (h ^ static_cast<uint8_t>(*s)) * 16777619u;
    return h;
}

uint32_t g_hash[kHookCount];
void* g_hook[kHookCount];  // this library's definition of each

// A slot rewritten, in the module loaded at `base` whose dynamic section
// is at `dynamic`.
struct Bound {
    uint64_t base;
    uint64_t dynamic;
    void** slot;
    void* previous;
};

SpinLock g_bind_lock;  // the table, and every rewrite of a slot
Bound* g_bound = nullptr;
size_t g_bound_count = 0;
size_t g_bound_capacity = 0;
uint64_t g_self_base = 0;
uint64_t g_loader_base = 0;
void* (*g_real_dlopen)(const char*, int) = nullptr;

bool keep(const Bound& b) {
    if (g_bound_count == g_bound_capacity) {
        size_t capacity = g_bound_capacity ? g_bound_capacity * 2 : 1024;
        auto* grown = static_cast<Bound*>(raw_map(capacity * sizeof(Bound)));
        if (!grown) return false;
        if (g_bound) {
            memcpy(grown, g_bound, g_bound_count * sizeof(Bound));
            raw_unmap(g_bound, g_bound_capacity * sizeof(Bound));
        }
        g_bound = grown;
        g_bound_capacity = capacity;
    }
    g_bound[g_bound_count++] = b;
    return true;
}

int hook_index(const char* name) {
    uint32_t h = name_hash(name);
    for (size_t i = 0; i < kHookCount; ++i)
        if (g_hash[i] == h && strcmp(kHooked[i], name) == 0) return static_cast<int>(i);
    return -1;
}

// What a module's dynamic section says about its relocations. The
// dynamic linker has made the addresses in it absolute (but in the vDSO,
// which has none of these).
struct Dynamic {
    const ElfW(Sym) * symtab = nullptr;
    const char* strtab = nullptr;
    const ElfW(Rela) * jmprel = nullptr;
    size_t jmprel_bytes = 0;
    const ElfW(Rela) * rela = nullptr;
    size_t rela_bytes = 0;
};

template <class T>
const T* dyn_pointer(uint64_t value, uint64_t base) {
    return reinterpret_cast<const T*>(value < base ? value + base : value);
}

Dynamic read_dynamic(const ElfW(Dyn) * d, uint64_t base) {
    Dynamic out;
    for (; d->d_tag != DT_NULL; ++d) {
        switch (d->d_tag) {
            case DT_SYMTAB: out.symtab = dyn_pointer<ElfW(Sym)>(d->d_un.d_ptr, base); break;
            case DT_STRTAB: out.strtab = dyn_pointer<char>(d->d_un.d_ptr, base); break;
            case DT_JMPREL: out.jmprel = dyn_pointer<ElfW(Rela)>(d->d_un.d_ptr, base); break;
            case DT_PLTRELSZ: out.jmprel_bytes = d->d_un.d_val; break;
            case DT_RELA: out.rela = dyn_pointer<ElfW(Rela)>(d->d_un.d_ptr, base); break;
            case DT_RELASZ: out.rela_bytes = d->d_un.d_val; break;
            default: break;
        }
    }
    return out;
}

struct Module {
    uint64_t base = 0;
    const ElfW(Dyn) * dynamic = nullptr;
    uint64_t relro_start = 0, relro_end = 0;  // page-aligned, 0 if none
};

Module module_of(const dl_phdr_info* info) {
    Module m;
    m.base = info->dlpi_addr;
    long page = sysconf(_SC_PAGESIZE);
    for (int i = 0; i < info->dlpi_phnum; ++i) {
        const ElfW(Phdr)& ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_DYNAMIC) m.dynamic = reinterpret_cast<const ElfW(Dyn)*>(m.base + ph.p_vaddr);
        if (ph.p_type == PT_GNU_RELRO) {
            m.relro_start = (m.base + ph.p_vaddr) & ~static_cast<uint64_t>(page - 1);
            m.relro_end = (m.base + ph.p_vaddr + ph.p_memsz + page - 1) & ~static_cast<uint64_t>(page - 1);
        }
    }
    return m;
}

// Makes the module's RELRO writable while it lives, if `slot` lies in it.
class RelroOpen {
public:
    explicit RelroOpen(const Module& m) : m_(m) {}
    void before_write(void** slot) {
        auto at = reinterpret_cast<uint64_t>(slot);
        if (open_ || at < m_.relro_start || at >= m_.relro_end) return;
        open_ = mprotect(reinterpret_cast<void*>(m_.relro_start), m_.relro_end - m_.relro_start,
                         PROT_READ | PROT_WRITE) == 0;
    }
    ~RelroOpen() {
        if (open_) mprotect(reinterpret_cast<void*>(m_.relro_start), m_.relro_end - m_.relro_start, PROT_READ);
    }
    RelroOpen(const RelroOpen&) = delete;
    RelroOpen& operator=(const RelroOpen&) = delete;

private:
    const Module& m_;
    bool open_ = false;
};

bool skipped(const dl_phdr_info* info) {
    return info->dlpi_addr == g_self_base || info->dlpi_addr == g_loader_base ||
           (info->dlpi_name && strstr(info->dlpi_name, "linux-vdso"));
}

void bind_relocations(const Module& m, const Dynamic& d, const ElfW(Rela) * rel, size_t bytes, RelroOpen& relro) {
    if (!rel || !d.symtab || !d.strtab) return;
    for (size_t i = 0; i < bytes / sizeof(ElfW(Rela)); ++i) {
        uint32_t type = ELF64_R_TYPE(rel[i].r_info);
        if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT) continue;
        uint32_t sym = ELF64_R_SYM(rel[i].r_info);
        if (!sym) continue;
        int hook = hook_index(d.strtab + d.symtab[sym].st_name);
        if (hook < 0) continue;
        auto** slot = reinterpret_cast<void**>(m.base + rel[i].r_offset);
        relro.before_write(slot);
        void* previous = *slot;
        if (previous == g_hook[hook]) continue;  // bound already
        if (!keep(Bound{m.base, reinterpret_cast<uint64_t>(m.dynamic), slot, previous})) return;
        __atomic_store_n(slot, g_hook[hook], __ATOMIC_RELEASE);
    }
}

int bind_module(dl_phdr_info* info, size_t, void*) {
    if (skipped(info)) return 0;
    Module m = module_of(info);
    if (!m.dynamic) return 0;
    Dynamic d = read_dynamic(m.dynamic, m.base);
    RelroOpen relro(m);
    bind_relocations(m, d, d.jmprel, d.jmprel_bytes, relro);
    bind_relocations(m, d, d.rela, d.rela_bytes, relro);
    return 0;
}

// Puts back the slots of this module, newest first; marks them done.
int unbind_module(dl_phdr_info* info, size_t, void*) {
    if (skipped(info)) return 0;
    Module m = module_of(info);
    if (!m.dynamic) return 0;
    RelroOpen relro(m);
    for (size_t i = g_bound_count; i-- > 0;) {
        Bound& b = g_bound[i];
        if (b.base != m.base || b.dynamic != reinterpret_cast<uint64_t>(m.dynamic) || !b.slot) continue;
        relro.before_write(b.slot);
        __atomic_store_n(b.slot, b.previous, __ATOMIC_RELEASE);
        b.slot = nullptr;
    }
    return 0;
}

// Marks the slots of the modules still loaded (slot kept), drops the rest.
int mark_loaded(dl_phdr_info* info, size_t, void* seen) {
    Module m = module_of(info);
    for (size_t i = 0; i < g_bound_count; ++i)
        if (g_bound[i].base == m.base && g_bound[i].dynamic == reinterpret_cast<uint64_t>(m.dynamic))
            static_cast<bool*>(seen)[i] = true;
    return 0;
}

bool find_hooks() {
    if (g_real_dlopen) return true;
    dl_find_object self, loader;
    if (_dl_find_object(reinterpret_cast<void*>(&find_hooks), &self) != 0) return false;
    g_self_base = self.dlfo_link_map->l_addr;
    if (_dl_find_object(static_cast<void*>(&_r_debug), &loader) == 0) g_loader_base = loader.dlfo_link_map->l_addr;
    // This library's own definitions: a handle searches its object first.
    // The handle is kept (the library is never unloaded), and closing it
    // would be the dlclose hook, which takes the lock held here.
    void* handle = dlopen(self.dlfo_link_map->l_name, RTLD_NOW | RTLD_NOLOAD);
    if (!handle) return false;
    for (size_t i = 0; i < kHookCount; ++i) {
        g_hash[i] = name_hash(kHooked[i]);
        g_hook[i] = strcmp(kHooked[i], "dlopen") == 0 ? nullptr : dlsym(handle, kHooked[i]);
    }
    g_real_dlopen =
        reinterpret_cast<void* (*)(const char*, int)>(definition_of("dlopen", dlsym(RTLD_DEFAULT, "dlopen")));
    return g_real_dlopen != nullptr;
}

bool g_bound_now = false;

// dlopen, bound in attached processes only (a preloaded recorder observes
// modules instead, hooks.cpp): the modules the real call added are bound
// before the program calls into them. Their constructors have run by
// then, unrecorded. The real dlopen sees this library as its caller, so a
// bare name is searched without the caller's RUNPATH
// (docs/design/attach.md).
void* attached_dlopen(const char* file, int mode) {
    void* handle = g_real_dlopen(file, mode);
    if (handle) {
        LockGuard guard(g_bind_lock);
        if (g_bound_now) dl_iterate_phdr(bind_module, nullptr);
    }
    return handle;
}

}  // namespace

bool bind_hooks() {
    LockGuard guard(g_bind_lock);
    if (!resolve_real_functions() || !find_hooks()) return false;
    for (size_t i = 0; i < kHookCount; ++i)
        if (strcmp(kHooked[i], "dlopen") == 0) g_hook[i] = reinterpret_cast<void*>(&attached_dlopen);
    for (void* hook : g_hook)
        if (!hook) return false;
    g_bound_now = true;
    dl_iterate_phdr(bind_module, nullptr);
    return true;
}

void unbind_hooks() {
    LockGuard guard(g_bind_lock);
    g_bound_now = false;
    dl_iterate_phdr(unbind_module, nullptr);
    g_bound_count = 0;
}

void forget_unloaded_modules() {
    LockGuard guard(g_bind_lock);
    if (!g_bound_count) return;
    auto* seen = static_cast<bool*>(raw_map(g_bound_count));
    if (!seen) return;
    dl_iterate_phdr(mark_loaded, seen);
    size_t kept = 0;
    for (size_t i = 0; i < g_bound_count; ++i)
        if (seen[i]) g_bound[kept++] = g_bound[i];
    raw_unmap(seen, g_bound_count);
    g_bound_count = kept;
}

}  // namespace heapsnap::recorder

using namespace heapsnap::recorder;

// Called by `heapsnap attach` right after its dlopen of this library, in
// the thread that loaded it: one it started in the process for that, or
// the thread it stopped, where the process may not map executable memory
// (src/cli/inject.h). Neither holds a lock. `settings`: NAME=value strings,
// each NUL-terminated, the last followed by an empty one (the HEAPSNAP_*
// variables of `heapsnap run`). `reply` receives the log's path, or why
// recording did not start. Returns 0 (started), 1 (already recording),
// 2 (preloaded), 3 (failed).
HEAPSNAP_EXPORT int heapsnap_attach_v1(const char* settings, char* reply, size_t cap) {
    constexpr int kMaxSettings = 64;
    char* table[kMaxSettings + 1];
    int n = 0;
    for (const char* s = settings; *s && n < kMaxSettings; s += strlen(s) + 1) table[n++] = const_cast<char*>(s);
    table[n] = nullptr;
    auto answer = [&](const char* text) {
        if (!cap) return;
        size_t len = strnlen(text, cap - 1);
        memcpy(reply, text, len);
        reply[len] = 0;
    };
    switch (start_attached(table)) {
        case AttachStart::Recording: answer(writer_log_path()); return 1;
        case AttachStart::Preloaded: answer("the recorder was preloaded"); return 2;
        case AttachStart::Failed: answer(last_alert()); return 3;
        case AttachStart::Started: break;
    }
    if (!bind_hooks()) {
        answer("cannot find the functions to bind in this process");
        abandon_attached();
        return 3;
    }
    answer(writer_log_path());
    return 0;
}
