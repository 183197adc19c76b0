#include "cli/inject.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <libunwind-ptrace.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "cli/control_client.h"
#include "cli/loader_stub.h"
#include "cli/short_slice.h"
#include "util/files.h"

namespace heapsnap::cli {
namespace {

std::string pid_text(pid_t pid) { return std::to_string(pid); }

double now_ms() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) / 1e6;
}

std::string read_text(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

// ---- the target's memory map ----------------------------------------------------

struct Mapping {
    uint64_t start = 0, end = 0, offset = 0;
    std::string path;
};

std::vector<Mapping> read_maps(pid_t pid) {
    std::vector<Mapping> maps;
    std::ifstream in("/proc/" + pid_text(pid) + "/maps");
    for (std::string line; std::getline(in, line);) {
        Mapping m;
        char perms[8];
        int consumed = 0;
        unsigned long long start, end, offset;
        if (sscanf(line.c_str(), "%llx-%llx %7s %llx %*s %*s %n", &start, &end, perms, &offset, &consumed) < 4)
            continue;
        m.start = start;
        m.end = end;
        m.offset = offset;
        if (consumed > 0 && static_cast<size_t>(consumed) < line.size()) m.path = line.substr(consumed);
        maps.push_back(m);
    }
    return maps;
}

bool is_loader(const std::string& path) {
    std::string base = basename_of(path);
    return base.rfind("ld-linux", 0) == 0 || (base.rfind("ld-", 0) == 0 && base.find(".so") != std::string::npos);
}

bool is_libc(const std::string& path) {
    std::string base = basename_of(path);
    return base.rfind("libc.so", 0) == 0 || base.rfind("libc-2.", 0) == 0;
}

// The address the object `path` is loaded at (its mapping of offset 0).
std::optional<uint64_t> base_of(const std::vector<Mapping>& maps, const std::string& path) {
    for (const Mapping& m : maps)
        if (m.path == path && m.offset == 0) return m.start;
    return std::nullopt;
}

const Mapping* mapping_at(const std::vector<Mapping>& maps, uint64_t addr) {
    for (const Mapping& m : maps)
        if (addr >= m.start && addr < m.end) return &m;
    return nullptr;
}

// ---- .dynsym of a shared object, read by hand ------------------------------------

struct Symbol {
    uint64_t value = 0, size = 0;
    std::string name;
};

// The defined functions of `file`'s .dynsym, by address.
std::vector<Symbol> dynamic_functions(const std::string& file) {
    std::vector<Symbol> out;
    int fd = open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return out;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(Elf64_Ehdr))) {
        close(fd);
        return out;
    }
    size_t size = static_cast<size_t>(st.st_size);
    void* mapped = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED) return out;
    const auto* bytes = static_cast<const uint8_t*>(mapped);
    auto within = [&](uint64_t off, uint64_t len) { return off <= size && len <= size - off; };
    const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(bytes);
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && eh->e_ident[EI_CLASS] == ELFCLASS64 &&
        eh->e_shentsize == sizeof(Elf64_Shdr) && within(eh->e_shoff, uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr))) {
        const auto* sh = reinterpret_cast<const Elf64_Shdr*>(bytes + eh->e_shoff);
        for (unsigned i = 0; i < eh->e_shnum; ++i) {
            if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_link >= eh->e_shnum) continue;
            const Elf64_Shdr& strings = sh[sh[i].sh_link];
            if (!within(sh[i].sh_offset, sh[i].sh_size) || !within(strings.sh_offset, strings.sh_size)) continue;
            const auto* syms = reinterpret_cast<const Elf64_Sym*>(bytes + sh[i].sh_offset);
            const char* names = reinterpret_cast<const char*>(bytes + strings.sh_offset);
            for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
                int type = ELF64_ST_TYPE(syms[k].st_info);
                if ((type != STT_FUNC && type != STT_GNU_IFUNC) || syms[k].st_shndx == SHN_UNDEF ||
                    syms[k].st_name >= strings.sh_size)
                    continue;
                const char* name = names + syms[k].st_name;
                out.push_back(Symbol{syms[k].st_value, syms[k].st_size,
                                     std::string(name, strnlen(name, strings.sh_size - syms[k].st_name))});
            }
        }
    }
    munmap(mapped, size);
    std::sort(out.begin(), out.end(), [](const Symbol& a, const Symbol& b) { return a.value < b.value; });
    return out;
}

std::optional<uint64_t> symbol_value(const std::vector<Symbol>& symbols, const std::string& name) {
    for (const Symbol& s : symbols)
        if (s.name == name && s.value) return s.value;
    return std::nullopt;
}

// The exported function whose code holds `vaddr`, or null.
const Symbol* function_at(const std::vector<Symbol>& symbols, uint64_t vaddr) {
    auto it = std::upper_bound(symbols.begin(), symbols.end(), vaddr,
                               [](uint64_t v, const Symbol& s) { return v < s.value; });
    while (it != symbols.begin()) {
        --it;
        if (vaddr < it->value + std::max<uint64_t>(it->size, 1)) return &*it;
        if (it->size) break;
    }
    return nullptr;
}

// libc functions that hold none of libc's locks while they block, and the
// entry functions at the bottom of every stack. A thread stopped in one of
// them (entered from the program) may run dlopen and the recorder's start.
const std::set<std::string> kSafeLibcEntries = {"read",
                                                "__read",
                                                "pread64",
                                                "readv",
                                                "write",
                                                "__write",
                                                "pwrite64",
                                                "writev",
                                                "recv",
                                                "recvfrom",
                                                "recvmsg",
                                                "send",
                                                "sendto",
                                                "sendmsg",
                                                "accept",
                                                "accept4",
                                                "connect",
                                                "poll",
                                                "__poll",
                                                "ppoll",
                                                "select",
                                                "__select",
                                                "pselect",
                                                "epoll_wait",
                                                "epoll_pwait",
                                                "epoll_pwait2",
                                                "nanosleep",
                                                "__nanosleep",
                                                "clock_nanosleep",
                                                "sleep",
                                                "usleep",
                                                "pause",
                                                "sigsuspend",
                                                "sigwait",
                                                "sigwaitinfo",
                                                "sigtimedwait",
                                                "wait",
                                                "waitpid",
                                                "__waitpid",
                                                "wait3",
                                                "wait4",
                                                "waitid",
                                                "pthread_join",
                                                "pthread_timedjoin_np",
                                                "pthread_clockjoin_np",
                                                "__pthread_clockjoin_ex",
                                                "pthread_cond_wait",
                                                "pthread_cond_timedwait",
                                                "pthread_cond_clockwait",
                                                "pthread_mutex_lock",
                                                "pthread_mutex_timedlock",
                                                "pthread_mutex_clocklock",
                                                "pthread_rwlock_rdlock",
                                                "pthread_rwlock_wrlock",
                                                "pthread_rwlock_timedrdlock",
                                                "pthread_rwlock_timedwrlock",
                                                "sem_wait",
                                                "sem_timedwait",
                                                "sem_clockwait",
                                                "pthread_barrier_wait",
                                                "msgrcv",
                                                "semop",
                                                "semtimedop",
                                                "flock",
                                                "syscall",
                                                "__libc_start_main",
                                                "clone",
                                                "__clone",
                                                "clone3",
                                                "__clone3"};

// System calls the kernel restarts unseen after PTRACE_INTERRUPT (they
// return ERESTARTSYS, ERESTARTNOHAND or ERESTART_RESTARTBLOCK): read 0,
// write 1, poll 7, pread64 17, readv 19, select 23, pause 34, nanosleep 35,
// connect 42, accept 43, sendto 44, recvfrom 45, sendmsg 46, recvmsg 47,
// wait4 61, rt_sigsuspend 130, futex 202, clock_nanosleep 230, waitid 247,
// pselect6 270, ppoll 271, accept4 288.
const std::set<long> kRestartedSyscalls = {0,  1,  7,  17, 19,  23,  34,  35,  42,  43,  44,
                                           45, 46, 47, 61, 130, 202, 230, 247, 270, 271, 288};

// 0: blocked in a system call restarted unseen; 1: running user code;
// 2: anything else (epoll_wait, a page fault...).
int thread_class(pid_t pid, pid_t tid) {
    std::string text = read_text("/proc/" + pid_text(pid) + "/task/" + pid_text(tid) + "/syscall");
    if (text.rfind("running", 0) == 0) return 1;
    char* end = nullptr;
    long nr = strtol(text.c_str(), &end, 10);
    if (end == text.c_str()) return 2;
    return kRestartedSyscalls.count(nr) ? 0 : 2;
}

std::vector<pid_t> threads_of(pid_t pid) {
    std::vector<pid_t> tids;
    DIR* dir = opendir(("/proc/" + pid_text(pid) + "/task").c_str());
    if (!dir) return tids;
    while (dirent* e = readdir(dir))
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9') tids.push_back(static_cast<pid_t>(atoi(e->d_name)));
    closedir(dir);
    std::sort(tids.begin(), tids.end());
    return tids;
}

// ---- why ptrace is refused -------------------------------------------------------

bool has_ptrace_capability() {
    std::string status = read_text("/proc/self/status");
    size_t at = status.find("CapEff:");
    if (at == std::string::npos) return geteuid() == 0;
    uint64_t caps = strtoull(status.c_str() + at + 7, nullptr, 16);
    return caps & (uint64_t{1} << 19);  // CAP_SYS_PTRACE
}

[[noreturn]] void ptrace_refused(pid_t pid, int err) {
    std::string who = "process " + pid_text(pid);
    std::string scope = read_text("/proc/sys/kernel/yama/ptrace_scope");
    int yama = scope.empty() ? 0 : atoi(scope.c_str());
    bool capable = has_ptrace_capability();
    std::string status = read_text("/proc/self/status");
    size_t seccomp = status.find("Seccomp:");
    int filtered = seccomp == std::string::npos ? 0 : atoi(status.c_str() + seccomp + 8);
    std::string reason;
    if (yama == 3)
        reason = "kernel.yama.ptrace_scope is 3: no process may be traced until the next boot";
    else if (yama == 2 && !capable)
        reason = "kernel.yama.ptrace_scope is 2: only CAP_SYS_PTRACE may trace; run heapsnap attach as root";
    else if (yama == 1 && !capable)
        reason =
            "kernel.yama.ptrace_scope is 1: only a parent may trace its descendants; run heapsnap attach as "
            "root, or 'sysctl kernel.yama.ptrace_scope=0'";
    else if (filtered == 2)
        reason =
            "a seccomp filter on heapsnap forbids ptrace (Seccomp: 2 in /proc/self/status); run it outside "
            "the filter (a container: --security-opt seccomp=unconfined)";
    else if (geteuid() == 0 && !capable)
        reason = "heapsnap lacks CAP_SYS_PTRACE (a container without it: add it, docker run --cap-add SYS_PTRACE)";
    else
        reason = std::string("ptrace: ") + strerror(err) +
                 " (is the process being traced by a debugger, or not "
                 "dumpable?)";
    throw AttachRefused(kExitPtraceForbidden, "cannot trace " + who + ": " + reason);
}

// ---- the stopped thread ------------------------------------------------------------

// libunwind-ptrace reads the stack and the unwind tables a word at a
// time, a PTRACE_PEEKDATA each: most of the check's time, while the thread
// waits. Its memory accessor is replaced by one that reads whole pages
// through /proc/PID/mem, kept for one unwind.
class PageReader {
public:
    explicit PageReader(int mem) : mem_(mem) {}
    bool word(uint64_t addr, uint64_t& value) {
        uint8_t bytes[8];
        for (int i = 0; i < 8; ++i) {
            const uint8_t* page = page_of(addr + i);
            if (!page) return false;
            bytes[i] = page[(addr + i) % kPage];
        }
        memcpy(&value, bytes, sizeof value);
        return true;
    }

private:
    static constexpr uint64_t kPage = 4096;
    const uint8_t* page_of(uint64_t addr) {
        uint64_t start = addr - addr % kPage;
        for (const auto& [at, bytes] : pages_)
            if (at == start) return bytes.data();
        std::vector<uint8_t> bytes(kPage);
        if (pread(mem_, bytes.data(), kPage, static_cast<off_t>(start)) != static_cast<ssize_t>(kPage)) return nullptr;
        pages_.emplace_back(start, std::move(bytes));
        return pages_.back().second.data();
    }
    int mem_;
    std::vector<std::pair<uint64_t, std::vector<uint8_t>>> pages_;
};

PageReader* g_unwind_pages = nullptr;  // the unwind under way (Target::unsafe_reason)

int access_paged_memory(unw_addr_space_t space, unw_word_t addr, unw_word_t* value, int write, void* arg) {
    if (write || !g_unwind_pages) return _UPT_access_mem(space, addr, value, write, arg);
    uint64_t word = 0;
    if (!g_unwind_pages->word(addr, word)) return -UNW_EINVAL;
    *value = word;
    return 0;
}

unw_accessors_t* paged_accessors() {
    static unw_accessors_t accessors = [] {
        unw_accessors_t a = _UPT_accessors;
        a.access_mem = access_paged_memory;
        return a;
    }();
    return &accessors;
}

// How long an injected call may run before heapsnap looks at where it is
// (Stopped::call_unless).
constexpr double kPatienceMs = 1;

// libc's lock wait, as calloc calls it (Target::find_lock_call).
struct LockWait {
    uint64_t lock_wait = 0, lock_wait_end = 0;  // __lll_lock_wait_private's code
    uint64_t lock_call = 0;                     // the return address after calloc's call of it
};

// Everything the injected calls change, saved to be put back.
struct Saved {
    user_regs_struct regs{};
    std::vector<uint8_t> xstate;
    uint64_t sigmask = 0;
};

class Target {
public:
    Target(pid_t pid) : pid_(pid), maps_(read_maps(pid)) {
        mem_ = open(("/proc/" + pid_text(pid) + "/mem").c_str(), O_RDWR | O_CLOEXEC);
        if (mem_ < 0) throw Error("process " + pid_text(pid) + ": cannot open its memory: " + strerror(errno));
        space_ = unw_create_addr_space(paged_accessors(), 0);
        unw_set_caching_policy(space_, UNW_CACHE_GLOBAL);
    }
    ~Target() {
        if (space_) unw_destroy_addr_space(space_);
        if (mem_ >= 0) close(mem_);
    }
    Target(const Target&) = delete;
    Target& operator=(const Target&) = delete;

    pid_t pid() const { return pid_; }
    std::vector<Mapping>& maps() { return maps_; }

    // The file as the process sees it (its mount namespace).
    std::string file(const std::string& path) const { return "/proc/" + pid_text(pid_) + "/root" + path; }

    const std::vector<Symbol>& symbols(const std::string& path) {
        auto it = symbols_.find(path);
        if (it == symbols_.end()) it = symbols_.emplace(path, dynamic_functions(file(path))).first;
        return it->second;
    }

    void write(uint64_t addr, const void* data, size_t n) {
        if (pwrite(mem_, data, n, static_cast<off_t>(addr)) != static_cast<ssize_t>(n))
            throw Error("process " + pid_text(pid_) + ": cannot write its memory: " + strerror(errno));
    }
    bool read(uint64_t addr, void* out, size_t n) {
        return pread(mem_, out, n, static_cast<off_t>(addr)) == static_cast<ssize_t>(n);
    }
    std::optional<uint64_t> read_word(uint64_t addr) {
        uint64_t word = 0;
        if (!read(addr, &word, sizeof word)) return std::nullopt;
        return word;
    }
    std::string read_string(uint64_t addr, size_t cap) {
        std::string buf(cap, '\0');
        ssize_t n = pread(mem_, buf.data(), cap, static_cast<off_t>(addr));
        if (n <= 0) return "";
        buf.resize(strnlen(buf.data(), static_cast<size_t>(n)));
        return buf;
    }

    // Why the stopped thread `tid` may not run the recorder's start now,
    // or "" if it may (the rules in inject.h).
    std::string unsafe_reason(pid_t tid) {
        std::vector<uint64_t> ips;
        switch (stack_ips(tid, ips)) {
            case Unwound::Unreadable: return "its stack cannot be read";
            case Unwound::Partly: return "its stack cannot be unwound";
            case Unwound::Whole: break;
        }
        const Symbol* run_entry = nullptr;
        bool in_run = false;
        for (size_t i = 0; i < ips.size(); ++i) {
            uint64_t at = i ? ips[i] - 1 : ips[i];  // a return address: the call is before it
            const Mapping* m = mapping_at(maps_, at);
            std::string path = m ? m->path : "";
            if (is_libc(path)) {
                auto base = base_of(maps_, path);
                const Symbol* fn = base ? function_at(symbols(path), at - *base) : nullptr;
                if (fn && !kSafeLibcEntries.count(fn->name)) return "it is in libc's " + fn->name;
                run_entry = fn;  // the outermost so far: where the run was entered
                in_run = true;
                continue;
            }
            if (in_run && !run_entry) return "it is in an internal function of libc";
            in_run = false;
            run_entry = nullptr;
            if (is_loader(path)) return "it is in the dynamic loader";
            if (basename_of(path) == "libheapsnap_preload.so") return "it is in the recorder";
            if (!path.empty() && path[0] == '/' && symbol_value(symbols(path), "malloc"))
                return "it is in the allocator " + basename_of(path);
        }
        return "";
    }

    // The stopped thread `tid` waits for its malloc arena's lock inside
    // `calloc`, called by the injection (return address 0), and holds no
    // lock: its stack is exactly __lll_lock_wait_private, in its futex
    // wait, then calloc at a direct call of it, then the call's return
    // address 0. `lock_call` is that call's return address, the only one
    // in calloc's code (find_lock_call), so it is calloc's first lock,
    // taken with nothing held.
    bool waits_for_arena(pid_t tid, const user_regs_struct& regs, const LockWait& wait) {
        if (regs.orig_rax != SYS_futex || (regs.rsi & 0x7f) != 0 /* FUTEX_WAIT */ || regs.rdx != 2) return false;
        std::vector<uint64_t> ips;
        // The return address 0 ends the stack; libunwind may step on past
        // it, into whatever lies above.
        bool whole = stack_ips(tid, ips) == Unwound::Whole;
        if (ips.size() > 2 ? ips[2] != 0 : !(whole && ips.size() == 2)) return false;
        return ips[0] >= wait.lock_wait && ips[0] < wait.lock_wait_end && ips[1] == wait.lock_call;
    }

    // Where libc's calloc calls __lll_lock_wait_private: the return address
    // after its one direct call (E8 rel32) in calloc's code, or nullopt if
    // there are none or several, or libc has no such functions.
    std::optional<LockWait> find_lock_call(const std::string& libc) {
        std::optional<uint64_t> base = base_of(maps_, libc);
        const std::vector<Symbol>& syms = symbols(libc);
        const Symbol *calloc_fn = nullptr, *wait_fn = nullptr;
        for (const Symbol& sym : syms) {
            if (sym.name == "calloc" && sym.size) calloc_fn = &sym;
            if (sym.name == "__lll_lock_wait_private" && sym.size) wait_fn = &sym;
        }
        if (!base || !calloc_fn || !wait_fn || calloc_fn->size > 65536) return std::nullopt;
        std::vector<uint8_t> code(calloc_fn->size);
        if (!read(*base + calloc_fn->value, code.data(), code.size())) return std::nullopt;
        std::optional<uint64_t> found;
        for (size_t i = 0; i + 5 <= code.size(); ++i) {
            if (code[i] != 0xe8) continue;
            int32_t rel;
            memcpy(&rel, &code[i + 1], sizeof rel);
            uint64_t after = calloc_fn->value + i + 5;
            if (after + static_cast<int64_t>(rel) != wait_fn->value) continue;
            if (found) return std::nullopt;
            found = *base + after;
        }
        if (!found) return std::nullopt;
        return LockWait{*base + wait_fn->value, *base + wait_fn->value + wait_fn->size, *found};
    }

private:
    enum class Unwound { Unreadable, Partly, Whole };

    // The stopped thread's return addresses, innermost first, as far as
    // they could be unwound.
    Unwound stack_ips(pid_t tid, std::vector<uint64_t>& ips) {
        ips.clear();
        void* upt = _UPT_create(tid);
        if (!upt) return Unwound::Unreadable;
        PageReader pages(mem_);
        g_unwind_pages = &pages;
        unw_cursor_t cursor;
        bool complete = false;
        if (unw_init_remote(&cursor, space_, upt) == 0) {
            for (int n = 0; n < 512; ++n) {
                unw_word_t ip = 0;
                unw_get_reg(&cursor, UNW_REG_IP, &ip);
                ips.push_back(ip);
                int step = unw_step(&cursor);
                if (step == 0) complete = true;
                if (step <= 0) break;
            }
        }
        g_unwind_pages = nullptr;
        _UPT_destroy(upt);
        return complete ? Unwound::Whole : Unwound::Partly;
    }

    pid_t pid_;
    std::vector<Mapping> maps_;
    int mem_ = -1;
    unw_addr_space_t space_ = nullptr;
    std::map<std::string, std::vector<Symbol>> symbols_;
};

constexpr size_t kXstateBytes = 16384;

// A seized, stopped thread; let go (its state put back) when destroyed.
class Stopped {
public:
    Stopped(pid_t tid) : tid_(tid) {}
    ~Stopped() { release(); }
    Stopped(const Stopped&) = delete;
    Stopped& operator=(const Stopped&) = delete;

    void save() {
        if (ptrace(PTRACE_GETREGS, tid_, nullptr, &saved_.regs) != 0)
            throw Error(std::string("PTRACE_GETREGS: ") + strerror(errno));
        saved_.xstate.assign(kXstateBytes, 0);
        iovec iov{saved_.xstate.data(), saved_.xstate.size()};
        if (ptrace(PTRACE_GETREGSET, tid_, reinterpret_cast<void*>(NT_X86_XSTATE), &iov) == 0)
            saved_.xstate.resize(iov.iov_len);
        else
            saved_.xstate.clear();
        ptrace(PTRACE_GETSIGMASK, tid_, reinterpret_cast<void*>(sizeof saved_.sigmask), &saved_.sigmask);
        uint64_t all = ~uint64_t{0};
        ptrace(PTRACE_SETSIGMASK, tid_, reinterpret_cast<void*>(sizeof all), &all);
        saved = true;
    }
    const user_regs_struct& regs() const { return saved_.regs; }

    // Calls fn(args...) (at most six) in the thread with its stack pointer
    // at `sp`; returns rax.
    uint64_t call(uint64_t fn, std::initializer_list<uint64_t> args, uint64_t sp, Target& target) {
        start_call(fn, args, sp, target);
        int signal = 0;
        for (;;) {
            resume(signal);
            int status = 0;
            if (waitpid(tid_, &status, __WALL) < 0) throw Error(std::string("waitpid: ") + strerror(errno));
            if (std::optional<uint64_t> rax = returned(status, signal, target)) return *rax;
        }
    }

    // As call(), but each time the call has run kPatienceMs more without
    // returning, the thread is interrupted and, if give_up(regs) says so,
    // the call is abandoned: nullopt, the thread stopped where it was
    // (release() puts its own state back).
    std::optional<uint64_t> call_unless(uint64_t fn, std::initializer_list<uint64_t> args, uint64_t sp, Target& target,
                                        const std::function<bool(const user_regs_struct&)>& give_up) {
        start_call(fn, args, sp, target);
        int signal = 0;
        bool interrupted = false;  // an interrupt asked for and not yet seen
        for (;;) {
            resume(signal);
            double ask_at = now_ms() + kPatienceMs;
            int status = 0;
            for (;;) {
                pid_t got = waitpid(tid_, &status, __WALL | (interrupted ? 0 : WNOHANG));
                if (got < 0) throw Error(std::string("waitpid: ") + strerror(errno));
                if (got == tid_) break;
                if (now_ms() < ask_at) {
                    timespec nap{0, 100000};
                    nanosleep(&nap, nullptr);
                    continue;
                }
                if (ptrace(PTRACE_INTERRUPT, tid_, nullptr, nullptr) != 0)
                    throw Error(std::string("PTRACE_INTERRUPT: ") + strerror(errno));
                interrupted = true;
            }
            if ((status >> 16) == PTRACE_EVENT_STOP && interrupted) {
                interrupted = false;
                user_regs_struct now;
                if (ptrace(PTRACE_GETREGS, tid_, nullptr, &now) == 0 && give_up(now)) return std::nullopt;
            }
            if (std::optional<uint64_t> rax = returned(status, signal, target)) return *rax;
        }
    }

    void release() {
        if (released_ || gone_) return;
        released_ = true;
        if (saved) {
            ptrace(PTRACE_SETREGS, tid_, nullptr, &saved_.regs);
            if (!saved_.xstate.empty()) {
                iovec iov{saved_.xstate.data(), saved_.xstate.size()};
                ptrace(PTRACE_SETREGSET, tid_, reinterpret_cast<void*>(NT_X86_XSTATE), &iov);
            }
            ptrace(PTRACE_SETSIGMASK, tid_, reinterpret_cast<void*>(sizeof saved_.sigmask), &saved_.sigmask);
        }
        ptrace(PTRACE_DETACH, tid_, nullptr, reinterpret_cast<void*>(static_cast<long>(pending_signal)));
    }

    bool saved = false;
    int pending_signal = 0;  // a signal-delivery stop met instead of ours: delivered at release

private:
    void start_call(uint64_t fn, std::initializer_list<uint64_t> args, uint64_t sp, Target& target) {
        user_regs_struct r = saved_.regs;
        sp &= ~uint64_t{15};
        sp -= 8;
        uint64_t zero = 0;
        target.write(sp, &zero, sizeof zero);
        r.rip = fn;
        unsigned long long* in[] = {&r.rdi, &r.rsi, &r.rdx, &r.rcx, &r.r8, &r.r9};
        size_t n = 0;
        for (uint64_t a : args)
            if (n < std::size(in)) *in[n++] = a;
        r.rax = 0;
        r.rsp = sp;
        r.orig_rax = ~0ull;  // no system call to restart on these registers
        if (ptrace(PTRACE_SETREGS, tid_, nullptr, &r) != 0)
            throw Error(std::string("PTRACE_SETREGS: ") + strerror(errno));
    }

    void resume(int signal) {
        if (ptrace(PTRACE_CONT, tid_, nullptr, reinterpret_cast<void*>(static_cast<long>(signal))) != 0)
            throw Error(std::string("PTRACE_CONT: ") + strerror(errno));
    }

    // The call's result if `status` is its end (the fault at return
    // address 0); else nullopt, with the signal to resume with.
    std::optional<uint64_t> returned(int status, int& signal, Target& target) {
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            gone_ = true;
            throw Error("process " + pid_text(target.pid()) + " ended during the injection");
        }
        signal = 0;
        if (status >> 16) return std::nullopt;  // a group stop or another event: go on
        int sig = WSTOPSIG(status);
        if (sig == SIGSEGV) {
            user_regs_struct after;
            ptrace(PTRACE_GETREGS, tid_, nullptr, &after);
            if (after.rip == 0) return after.rax;
            throw Error("process " + pid_text(target.pid()) + " faulted in the injected call");
        }
        signal = sig;  // not one of ours: delivered as it came
        return std::nullopt;
    }

    pid_t tid_;
    Saved saved_;
    bool released_ = false;
    bool gone_ = false;
};

// Seizes and stops `tid`; false (nothing held) if it is gone meanwhile.
// A stop of another kind than the interrupt's (a signal being delivered)
// lets the thread go with that signal.
bool stop_thread(pid_t pid, pid_t tid) {
    if (ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
        if (errno == ESRCH) return false;
        ptrace_refused(pid, errno);
    }
    if (ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr) != 0) {
        ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
        return false;
    }
    int status = 0;
    if (waitpid(tid, &status, __WALL) < 0 || !WIFSTOPPED(status)) return false;
    if ((status >> 16) != PTRACE_EVENT_STOP) {
        ptrace(PTRACE_DETACH, tid, nullptr, reinterpret_cast<void*>(static_cast<long>(WSTOPSIG(status))));
        return false;
    }
    return true;
}

bool process_stopped(pid_t pid) {
    std::string stat = read_text("/proc/" + pid_text(pid) + "/stat");
    size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && (stat[paren + 2] == 'T' || stat[paren + 2] == 't');
}

// ---- the calls -----------------------------------------------------------------------

// libc's functions the injection calls, at their addresses in the process.
struct LibcFunctions {
    uint64_t mmap, munmap, pthread_create, pthread_self, pthread_detach, dlopen, dlerror, calloc, free;
};

// What the recorder's start answered (heapsnap_attach_v1: 0 to 3), or
// kNotLoaded with dlerror()'s text.
struct Outcome {
    int result = kNotLoaded;
    std::string text;
};

uint64_t round_up(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

bool failed_call(uint64_t rax) { return rax > ~uint64_t{4095}; }  // -errno, as a system call returns it

// The region the loader thread runs in: its code, then its block.
struct LoaderRegion {
    uint64_t start = 0, bytes = 0, block = 0;
};

// The region, mapped by the stopped thread's first call and filled in;
// start 0 if the process may not map executable memory (an SELinux
// execmem denial, a seccomp filter).
LoaderRegion map_loader(Stopped& thread, Target& target, const LibcFunctions& libc, uint64_t call_sp,
                        const std::string& library, const std::string& settings, uint64_t attach_offset,
                        const std::optional<SchedAttributes>& sched) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t code_bytes = round_up(loader_code_bytes(), page);
    std::string block(sizeof(LoaderBlock), '\0');
    size_t path_at = block.size();
    block += library;
    block.push_back('\0');
    size_t settings_at = block.size();
    block += settings;
    size_t reply_at = block.size();
    block.append(kReplyBytes, '\0');
    const uint64_t block_bytes = round_up(block.size(), page);
    const uint64_t region_bytes = code_bytes + block_bytes;
    uint64_t region =
        thread.call(libc.mmap, {0, region_bytes, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, ~uint64_t{0}, 0},
                    call_sp, target);
    if (failed_call(region)) return {};
    const uint64_t at = region + code_bytes;
    LoaderBlock head{};
    head.pthread_self = libc.pthread_self;
    head.pthread_detach = libc.pthread_detach;
    head.dlopen = libc.dlopen;
    head.dlerror = libc.dlerror;
    head.munmap = libc.munmap;
    head.free = libc.free;
    head.attach_offset = attach_offset;
    head.region = region;
    head.region_bytes = region_bytes;
    head.block_bytes = block_bytes;
    head.path = at + path_at;
    head.settings = at + settings_at;
    head.reply = at + reply_at;
    head.outcome = kLoaderRunning;
    strncpy(head.name, "heapsnap-loader", sizeof head.name);
    if (sched) head.sched = *sched;
    memcpy(block.data(), &head, sizeof head);
    // Through /proc/PID/mem, which writes read-only pages too.
    target.write(region, loader_code(), loader_code_bytes());
    target.write(at, block.data(), block.size());
    return {region, region_bytes, at};
}

// After the stopped thread is let go: waits for the loader thread's
// outcome, reads it, and lets the thread unmap its region.
Outcome await_loader(Target& target, uint64_t block, const std::string& who) {
    constexpr double kPatienceMs = 30000;
    double give_up = now_ms() + kPatienceMs;
    int32_t outcome = kLoaderRunning;
    for (;;) {
        if (!target.read(block + offsetof(LoaderBlock, outcome), &outcome, sizeof outcome))
            throw Error(who + " ended before the recorder started");
        if (outcome != kLoaderRunning) break;
        if (now_ms() > give_up) throw Error(who + ": the recorder did not start within 30 s");
        timespec nap{0, 1000000};
        nanosleep(&nap, nullptr);
    }
    LoaderBlock head{};
    if (!target.read(block, &head, sizeof head)) throw Error(who + " ended before the recorder started");
    Outcome out{outcome, ""};
    if (outcome == kNotLoaded)
        out.text = head.error_text ? target.read_string(head.error_text, 1024) : "";
    else
        out.text = target.read_string(head.reply, kReplyBytes);
    int32_t seen = 1;
    target.write(block + offsetof(LoaderBlock, read), &seen, sizeof seen);
    return out;
}

// The outcome as attach reports it.
Injected injected(const Outcome& outcome, double stopped_ms, pid_t tid, unsigned tried, const std::string& who) {
    switch (outcome.result) {
        case 0: return Injected{outcome.text, stopped_ms, tid, tried};
        case 1: throw AttachRefused(kExitAlreadyRecorded, who + " is already recorded into " + outcome.text);
        case 2:
            throw Error(who +
                        " has the recorder preloaded, but it records no more (its recording ended or failed); it "
                        "cannot be attached");
        case kNotLoaded:
            throw Error(who + ": dlopen of the recorder failed" + (outcome.text.empty() ? "" : ": " + outcome.text));
        default: throw Error(who + ": recording could not start: " + outcome.text);
    }
}

// Where no loader thread can run (the process may not map executable
// memory, or start a thread): dlopen and the recorder's start are called
// in the stopped thread itself, at `data` (below its stack pointer, as
// the calls' arguments).
Outcome load_in_stopped_thread(Stopped& thread, Target& target, const LibcFunctions& libc, uint64_t data,
                               const std::string& library, const std::string& settings, uint64_t attach_offset,
                               const std::string& who) {
    std::string blob = library;
    blob.push_back('\0');
    size_t settings_at = blob.size();
    blob += settings;
    size_t reply_at = blob.size();
    blob.append(kReplyBytes, '\0');
    data = (data - blob.size()) & ~uint64_t{15};
    target.write(data, blob.data(), blob.size());
    uint64_t call_sp = data - 64;
    uint64_t handle = thread.call(libc.dlopen, {data, RTLD_NOW}, call_sp, target);
    if (!handle) {
        uint64_t text = thread.call(libc.dlerror, {}, call_sp, target);
        return Outcome{kNotLoaded, text ? target.read_string(text, 1024) : ""};
    }
    // dlopen's handle is the library's link_map, whose first field,
    // l_addr, is where it was loaded.
    std::optional<uint64_t> base = target.read_word(handle);
    if (!base) throw Error(who + ": the recorder's link map cannot be read after its dlopen");
    uint64_t result =
        thread.call(*base + attach_offset, {data + settings_at, data + reply_at, kReplyBytes}, call_sp, target);
    return Outcome{static_cast<int>(result), target.read_string(data + reply_at, kReplyBytes)};
}

// What goes into the process, known before any thread stops.
struct Plan {
    LibcFunctions libc{};
    std::string library;
    std::string settings;        // NAME=value strings, an empty one last
    uint64_t attach_offset = 0;  // heapsnap_attach_v1 in the library
    // Set where pthread_create's calloc is libc's and its lock wait can be
    // told apart (Target::find_lock_call): the arena is tried first.
    std::optional<LockWait> arena_wait;
};

constexpr uint64_t kProbeBytes = 256;  // the calloc that tries the arena's lock
static_assert(kProbeBlocks >= 2);
constexpr const char* kArenaLocked = "another thread holds the lock of its malloc arena";

// Steps 2 and 3 for the thread `tid`; nullopt if it is gone, or was let go
// as unsafe (`why` then says why).
// `blocks`: the trial callocs of tries given up, not freed yet.
std::optional<Injected> try_thread(pid_t pid, pid_t tid, Target& target, const Plan& plan, unsigned tried,
                                   std::vector<uint64_t>& blocks, std::string& why) {
    const std::string who = "process " + pid_text(pid);
    ShortSlice brief(tid);
    if (!stop_thread(pid, tid)) return std::nullopt;
    // The stop is timed from here, waitpid having just reported it: until
    // then the thread ran on, or waited for a CPU it would have waited for
    // anyway (a busy thread among more threads than CPUs, for up to a few
    // scheduler ticks).
    double stop_start = now_ms();
    Stopped thread(tid);
    why = target.unsafe_reason(tid);
    if (!why.empty()) {
        brief.restore();
        return std::nullopt;  // let go at once
    }
    thread.save();
    // Below the red zone: pthread_create's thread id, then the calls' frames.
    uint64_t top = (thread.regs().rsp - 128 - 64) & ~uint64_t{15};
    uint64_t call_sp = top - 64;
    LoaderRegion region =
        map_loader(thread, target, plan.libc, call_sp, plan.library, plan.settings, plan.attach_offset, brief.saved());
    if (region.start) {
        // pthread_create callocs the new thread's TLS vector from this
        // thread's malloc arena. Its lock may be held by a running thread
        // that waits for a CPU, for tens of milliseconds; a calloc of the
        // same arena tries it first, and is given up, with nothing held,
        // if it waits (docs/design/attach.md). One that returned, but only
        // after a millisecond, met the lock contended: the try ends there
        // too, its block kept for the loader thread to free.
        if (plan.arena_wait) {
            double asked = now_ms();
            std::optional<uint64_t> got = thread.call_unless(
                plan.libc.calloc, {1, kProbeBytes}, call_sp, target,
                [&](const user_regs_struct& regs) { return target.waits_for_arena(tid, regs, *plan.arena_wait); });
            // blocks.size() < kProbeBlocks on every try: a slow calloc
            // ends the try only while another block will fit.
            bool slow = now_ms() - asked > kPatienceMs;
            if (got && *got) blocks.push_back(*got);
            if (!got || (slow && blocks.size() < kProbeBlocks)) {
                thread.call(plan.libc.munmap, {region.start, region.bytes}, call_sp, target);
                brief.restore();
                thread.release();
                why = kArenaLocked;
                return std::nullopt;
            }
            target.write(region.block + offsetof(LoaderBlock, probes), blocks.data(), blocks.size() * 8);
        }
        if (thread.call(plan.libc.pthread_create, {top, 0, region.start, region.block}, call_sp, target) == 0) {
            brief.restore();
            thread.release();
            double stopped = now_ms() - stop_start;
            return injected(await_loader(target, region.block, who), stopped, tid, tried, who);
        }
        // No thread could be started (RLIMIT_NPROC, a seccomp filter): the
        // region goes, and the stopped thread loads the recorder itself.
        thread.call(plan.libc.munmap, {region.start, region.bytes}, call_sp, target);
    }
    for (uint64_t block : blocks) thread.call(plan.libc.free, {block}, call_sp, target);
    blocks.clear();
    Outcome outcome =
        load_in_stopped_thread(thread, target, plan.libc, top, plan.library, plan.settings, plan.attach_offset, who);
    brief.restore();
    thread.release();
    return injected(outcome, now_ms() - stop_start, tid, tried, who);
}

// Candidates: restarted system calls first, then running threads, then
// the rest; rounds until one is safe.
Injected borrow_a_thread(pid_t pid, Target& target, const Plan& plan) {
    ShortSlice own(0);
    std::vector<std::string> reasons;  // the last round's, in the order tried
    std::vector<uint64_t> blocks;      // try_thread's
    unsigned tried = 0, locked_rounds = 0;
    double give_up = now_ms() + 5000;
    while (now_ms() < give_up) {
        std::vector<std::pair<int, pid_t>> tids;
        for (pid_t tid : threads_of(pid)) tids.emplace_back(thread_class(pid, tid), tid);
        if (tids.empty()) throw AttachRefused(kExitNoProcess, "no process with PID " + pid_text(pid));
        std::stable_sort(tids.begin(), tids.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        reasons.clear();
        bool arena_locked = false;
        for (auto [kind, tid] : tids) {
            std::string why;
            if (std::optional<Injected> done = try_thread(pid, tid, target, plan, tried, blocks, why)) return *done;
            if (why.empty()) continue;  // gone meanwhile
            reasons.push_back("thread " + pid_text(tid) + ": " + why);
            ++tried;
            // A thread safe but for its arena's lock is still the best
            // candidate: the round ends there, and the next one starts
            // with it again, rather than stopping the busy threads after
            // it, unless its arena has stayed locked for three rounds.
            if (why == kArenaLocked) {
                arena_locked = true;
                if (locked_rounds < 3) break;
            }
        }
        // 2 ms between rounds; while an arena's lock stays held (its holder
        // may wait for a CPU, or for I/O), twice as long each round, up to
        // 64 ms, so that a thread is not stopped again and again meanwhile.
        locked_rounds = arena_locked ? std::min(locked_rounds + 1, 6u) : 0;
        timespec pause{0, 2000000L << (locked_rounds ? locked_rounds - 1 : 0)};
        nanosleep(&pause, nullptr);
    }
    // The first three candidates' reasons: the likeliest threads.
    constexpr size_t kShown = 3;
    std::string why;
    for (size_t i = 0; i < reasons.size() && i < kShown; ++i) why += (i ? "; " : "") + reasons[i];
    if (reasons.size() > kShown) why += "; " + std::to_string(reasons.size() - kShown) + " more";
    throw Error("process " + pid_text(pid) + ": no thread could load the recorder safely within 5 s (" + why + ")");
}

// Runs fn() on a thread of its own; returns what it returns, throws what
// it throws. The injection runs there because Linux's scheduler (EEVDF)
// keeps a task's lag across its sleeps: by then heapsnap's main thread has
// had the CPU for a while (loading its libraries, reading libc's symbols),
// and with every CPU busy each of its wakeups during the stop would wait
// until that is paid back. A new thread owes nothing.
template <class Fn>
auto on_new_thread(Fn fn) -> decltype(fn()) {
    std::optional<decltype(fn())> result;
    std::exception_ptr failure;
    std::thread worker([&] {
        try {
            result.emplace(fn());
        } catch (...) {
            failure = std::current_exception();
        }
    });
    worker.join();
    if (failure) std::rethrow_exception(failure);
    return std::move(*result);
}

}  // namespace

void check_process(pid_t pid, const char* verb) {
    std::optional<ProcessUids> uids = process_uids(pid);
    if (!uids) throw AttachRefused(kExitNoProcess, "no process with PID " + pid_text(pid));
    uid_t me = geteuid();
    if (me != 0 && !(uids->real == me && uids->effective == me && uids->saved == me)) {
        std::string ids = "uid " + std::to_string(uids->real);
        if (uids->effective != uids->real) ids += ", effective uid " + std::to_string(uids->effective);
        throw AttachRefused(kExitOtherUser, "process " + pid_text(pid) + " belongs to another user (" + ids +
                                                "); only root and that user may " + verb + " it");
    }
}

Injected inject_recorder(pid_t pid, const std::string& library,
                         const std::vector<std::pair<std::string, std::string>>& settings) {
    std::string who = "process " + pid_text(pid);
    check_process(pid, "attach to");
    std::optional<ProcessUids> uids = process_uids(pid);
    try {
        ControlAnswer answer = control_exchange(pid, *uids, "info\n", 5, "answer");
        if (std::optional<InfoAnswer> info = parse_info_answer(answer.text))
            throw AttachRefused(kExitAlreadyRecorded, who + " is already recorded into " + info->log);
    } catch (const ControlError& e) {
        if (e.kind == ControlError::Kind::Timeout)
            throw Error(who + " has a heapsnap control socket but does not answer (is it stopped?)");
    }
    if (process_stopped(pid)) throw Error(who + " is stopped (SIGSTOP or a debugger); continue it first");

    Target target(pid);
    std::string libc, loader;
    for (const Mapping& m : target.maps()) {
        if (libc.empty() && is_libc(m.path)) libc = m.path;
        if (loader.empty() && is_loader(m.path)) loader = m.path;
    }
    std::string exe = read_text("/proc/" + pid_text(pid) + "/cmdline");
    exe = exe.c_str();
    if (loader.empty())
        throw AttachRefused(kExitStatic, who + " (" + exe +
                                             ") is statically linked: the recorder can only be "
                                             "loaded into a dynamically linked program (run it under heapsnap run? "
                                             "that needs a dynamic one too)");
    if (libc.empty())
        throw AttachRefused(kExitStatic, who + " (" + exe + ") does not use glibc: the recorder needs it");
    std::optional<uint64_t> libc_base = base_of(target.maps(), libc);
    auto in_libc = [&](const char* name) {
        std::optional<uint64_t> value = symbol_value(target.symbols(libc), name);
        if (!libc_base || !value)
            throw Error(who + ": its libc (" + libc + ") has no " + name + " (glibc 2.34 or later is needed)");
        return *libc_base + *value;
    };
    Plan plan;
    plan.libc = {in_libc("mmap"),         in_libc("munmap"),         in_libc("pthread_create"),
                 in_libc("pthread_self"), in_libc("pthread_detach"), in_libc("dlopen"),
                 in_libc("dlerror"),      in_libc("calloc"),         in_libc("free")};
    // ld.so callocs TLS vectors with the first calloc in the global scope:
    // libc's, unless a module (jemalloc, the program) defines its own.
    bool own_calloc = false;
    for (const Mapping& m : target.maps()) {
        if (m.path.empty() || m.path[0] != '/' || m.path == libc || is_loader(m.path) ||
            basename_of(m.path) == "libheapsnap_preload.so")
            continue;
        if (symbol_value(target.symbols(m.path), "calloc")) own_calloc = true;
    }
    if (!own_calloc) plan.arena_wait = target.find_lock_call(libc);
    std::optional<uint64_t> attach_at = symbol_value(dynamic_functions(library), "heapsnap_attach_v1");
    if (!attach_at) throw Error(library + ": not a heapsnap recorder (no heapsnap_attach_v1)");
    plan.library = library;
    plan.attach_offset = *attach_at;
    for (const auto& [name, value] : settings) {
        if (value.empty()) continue;
        plan.settings += name + "=" + value;
        plan.settings.push_back('\0');
    }
    plan.settings.push_back('\0');
    return on_new_thread([&] { return borrow_a_thread(pid, target, plan); });
}

}  // namespace heapsnap::cli
