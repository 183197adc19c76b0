// See symbol_cache.h for what the cache keeps and when it is believed;
// formats/symbol-cache.md for the file.
#include "symbolize/symbol_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "format/framed_file.h"
#include "util/diagnostics.h"
#include "util/error.h"
#include "util/read_budget.h"
#include "util/text.h"

namespace heapsnap {
namespace {

const FileKind kSymbolCacheKind{"HSNAPSYM", 1, "symbol cache"};
const char kSuffix[] = ".hssym";
constexpr size_t kHeaderSize = 16;
constexpr size_t kMaxBuildId = 64;

uint64_t nanoseconds(const struct timespec& t) {
    return static_cast<uint64_t>(t.tv_sec) * 1000000000u + static_cast<uint64_t>(t.tv_nsec);
}

FileIdentity identity_from(const struct stat& st, const std::string& path) {
    return FileIdentity{path, true, static_cast<uint64_t>(st.st_size), nanoseconds(st.st_mtim),
                        static_cast<uint64_t>(st.st_ino)};
}

// "<build-id>-<FNV-1a of the path>.hssym": one file per build-id and path,
// as two copies of a binary (one stripped) may share a build-id.
std::string file_name(const ModuleRef& module) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : module.path) h = (h ^ c) * 0x100000001b3ull;
    char path_hash[17];
    std::snprintf(path_hash, sizeof path_hash, "%016llx", static_cast<unsigned long long>(h));
    return hex_of(module.build_id) + "-" + path_hash + kSuffix;
}

bool cacheable(const ModuleRef& module) {
    return !module.build_id.empty() && module.build_id.size() <= kMaxBuildId && !module.path.empty() &&
           module.path[0] == '/';
}

// A file of the caller's, mode 0600, as save() makes it.
bool trusted(const struct stat& st) {
    return S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 07777) == 0600;
}

// One warning for the process, whatever else goes wrong with the cache.
void warn_once(const std::string& text) {
    static bool warned = false;
    if (warned) return;
    warned = true;
    warn(text);
}

bool debuginfod_configured() {
    const char* urls = std::getenv("DEBUGINFOD_URLS");
    return urls && *urls;
}

// mkdir -p with mode 0700 for what is missing, whatever the umask.
void make_dir(const std::string& dir) {
    if (mkdir(dir.c_str(), 0700) == 0) chmod(dir.c_str(), 0700);
}

void make_dirs(const std::string& dir) {
    for (size_t slash = dir.find('/', 1); slash != std::string::npos; slash = dir.find('/', slash + 1))
        make_dir(dir.substr(0, slash));
    make_dir(dir);
}

}  // namespace

FileIdentity identity_of(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return FileIdentity{path};
    return identity_from(st, path);
}

FileIdentity identity_of(int fd, const std::string& path) {
    struct stat st;
    if (fstat(fd, &st) != 0) return FileIdentity{path};
    return identity_from(st, path);
}

uint32_t ModuleSymbols::intern(const std::string& text) {
    auto found = string_ids_.find(text);
    if (found != string_ids_.end()) return found->second;
    auto id = static_cast<uint32_t>(strings_.size());
    strings_.push_back(text);
    string_ids_.emplace(strings_.back(), id);
    return id;
}

bool ModuleSymbols::find(uint64_t vaddr, std::vector<SymbolFrame>& frames) const {
    auto found = entries_.find(vaddr);
    if (found == entries_.end()) return false;
    frames.clear();
    for (uint32_t i = 0; i < found->second.count; ++i) {
        const Frame& f = frames_[found->second.first + i];
        SymbolFrame& out = frames.emplace_back();
        out.function = strings_[f.function];
        out.file = strings_[f.file];
        out.line = f.line;
        out.inlined = f.inlined;
    }
    return true;
}

bool ModuleSymbols::add(uint64_t vaddr, const std::vector<SymbolFrame>& frames) {
    if (entries_.size() >= kMaxCachedAddresses || frames.empty() || frames.size() > kMaxCachedFrames ||
        entries_.contains(vaddr))
        return false;
    for (const SymbolFrame& f : frames)
        if (f.function.size() > kMaxCachedString || f.file.size() > kMaxCachedString) return false;
    entries_[vaddr] = Entry{static_cast<uint32_t>(frames_.size()), static_cast<uint32_t>(frames.size())};
    for (const SymbolFrame& f : frames) frames_.push_back(Frame{intern(f.function), intern(f.file), f.line, f.inlined});
    return true;
}

std::vector<uint8_t> ModuleSymbols::encode(const ModuleRef& module) const {
    ByteBuffer o;
    o.str(module.build_id);
    o.str(module.path);
    o.u8(has_dwarf ? 1 : 0);
    o.varint(sources.size());
    for (const FileIdentity& source : sources) {
        o.str(source.path);
        o.u8(source.present ? 1 : 0);
        if (!source.present) continue;
        o.varint(source.size);
        o.varint(source.mtime_ns);
        o.varint(source.inode);
    }
    o.varint(strings_.size() - 1);
    for (size_t i = 1; i < strings_.size(); ++i) o.str(strings_[i]);
    std::vector<uint64_t> vaddrs;
    vaddrs.reserve(entries_.size());
    for (const auto& [vaddr, entry] : entries_) vaddrs.push_back(vaddr);
    std::sort(vaddrs.begin(), vaddrs.end());
    o.varint(vaddrs.size());
    uint64_t previous = 0;
    for (size_t i = 0; i < vaddrs.size(); ++i) {
        o.varint(i == 0 ? vaddrs[i] : vaddrs[i] - previous);
        previous = vaddrs[i];
        const Entry& entry = entries_.at(vaddrs[i]);
        o.varint(entry.count);
        for (uint32_t k = 0; k < entry.count; ++k) {
            const Frame& f = frames_[entry.first + k];
            o.varint(f.function);
            o.varint(f.file);
            o.varint(f.line);
            o.u8(f.inlined ? 1 : 0);
        }
    }
    return std::move(o.bytes());
}

// Every field is checked, so that a file that decodes gives exactly the
// frames the symbolizer would: each string index in range, addresses
// strictly increasing, each address's frames inlined but the last.
std::optional<ModuleSymbols> ModuleSymbols::decode(const std::vector<uint8_t>& body, const ModuleRef& module) {
    codec::Reader r(body.data(), body.size());
    ModuleSymbols symbols;
    if (r.str() != module.build_id || r.str() != module.path) return std::nullopt;
    uint8_t has_dwarf = r.u8();
    if (has_dwarf > 1) return std::nullopt;
    symbols.has_dwarf = has_dwarf;
    for (uint64_t n = r.count(2, kMaxCacheSources); n-- && r.ok();) {
        FileIdentity& source = symbols.sources.emplace_back();
        source.path = r.str();
        uint8_t present = r.u8();
        if (present > 1 || source.path.empty() || source.path[0] != '/') return std::nullopt;
        source.present = present;
        if (!present) continue;
        source.size = r.varint();
        source.mtime_ns = r.varint();
        source.inode = r.varint();
    }
    if (!r.ok() || symbols.sources.empty() || symbols.sources[0].path != module.path || !symbols.sources[0].present)
        return std::nullopt;
    for (uint64_t n = r.count(1); n-- && r.ok();) {
        std::string_view text = r.str();
        if (text.size() > kMaxCachedString) return std::nullopt;
        symbols.strings_.emplace_back(text);
    }
    if (!r.ok()) return std::nullopt;
    uint64_t strings = symbols.strings_.size();
    uint64_t vaddr = 0;
    for (uint64_t n = r.count(2, kMaxCachedAddresses), i = 0; i < n && r.ok(); ++i) {
        uint64_t delta = r.varint();
        if (i > 0 && (delta == 0 || vaddr + delta < vaddr)) return std::nullopt;
        vaddr += delta;
        uint64_t count = r.count(4, kMaxCachedFrames);
        if (count == 0) return std::nullopt;
        symbols.entries_[vaddr] = Entry{static_cast<uint32_t>(symbols.frames_.size()), static_cast<uint32_t>(count)};
        for (uint64_t k = 0; k < count && r.ok(); ++k) {
            uint64_t function = r.varint();
            uint64_t file = r.varint();
            uint64_t line = r.varint();
            uint8_t inlined = r.u8();
            if (function >= strings || file >= strings || line > UINT32_MAX || inlined != (k + 1 < count ? 1 : 0))
                return std::nullopt;
            symbols.frames_.push_back(Frame{static_cast<uint32_t>(function), static_cast<uint32_t>(file),
                                            static_cast<uint32_t>(line), inlined == 1});
        }
    }
    if (!r.ok() || !r.at_end()) return std::nullopt;
    // Interned only now, as a file may be extended by this run's lookups.
    for (size_t i = 1; i < symbols.strings_.size(); ++i) symbols.string_ids_.try_emplace(symbols.strings_[i], i);
    return symbols;
}

SymbolCache::SymbolCache(std::string dir) : dir_(std::move(dir)) {}

// The directory, once per process: created if missing, and used only if
// it is the caller's with nobody else let in (mode 0700).
bool SymbolCache::open_dir() {
    if (dir_tried_) return static_cast<bool>(dir_fd_);
    dir_tried_ = true;
    make_dirs(dir_);
    UniqueFd fd(open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    // Nowhere to keep it (a read-only or missing home) is no news.
    if (!fd && (errno == ENOENT || errno == EACCES || errno == EROFS)) return false;
    struct stat st;
    if (!fd || fstat(fd.get(), &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        warn_once(dir_ + ": not a directory of yours with mode 0700; the symbol cache is not used");
        return false;
    }
    dir_fd_ = std::move(fd);
    return true;
}

std::optional<ModuleSymbols> SymbolCache::load(const ModuleRef& module) {
    if (!cacheable(module) || !open_dir()) return std::nullopt;
    std::string name = file_name(module);
    std::string shown = dir_ + "/" + name;
    UniqueFd fd(openat(dir_fd_.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
    if (!fd) {
        if (errno != ENOENT) warn_once(shown + ": not a regular file of yours; ignored, and written anew");
        return std::nullopt;
    }
    struct stat st;
    if (fstat(fd.get(), &st) != 0 || !trusted(st) || static_cast<uint64_t>(st.st_size) > kMaxCacheFileBytes) {
        warn_once(shown + ": not a regular file of yours with mode 0600 under 32 MiB; ignored, and written anew");
        return std::nullopt;
    }
    std::optional<ModuleSymbols> symbols;
    try {
        std::vector<uint8_t> file = read_open_file(fd.get(), shown);
        // The body's announced size, checked before anything is inflated.
        unsigned long long content =
            file.size() > kHeaderSize ? ZSTD_getFrameContentSize(file.data() + kHeaderSize, file.size() - kHeaderSize)
                                      : 0;
        if (content <= kMaxCacheBodyBytes) {
            budget_add_input(fd.get());
            MemoryCharge held;
            symbols = ModuleSymbols::decode(decode_framed(shown, kSymbolCacheKind, file, held), module);
        }
    } catch (const Error&) {
    }
    if (!symbols) {
        warn_once(shown + ": not a sound symbol cache file for this module; ignored, and written anew");
        return std::nullopt;
    }
    if (!symbols->has_dwarf && debuginfod_configured()) return std::nullopt;
    for (const FileIdentity& source : symbols->sources)
        if (identity_of(source.path) != source) return std::nullopt;
    // Used now: pruning removes the files used least recently.
    const struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
    futimens(fd.get(), times);
    return symbols;
}

void SymbolCache::save(const ModuleRef& module, const ModuleSymbols& symbols) {
    // Without DWARF, a debuginfod server may have it next time (load).
    if (!cacheable(module) || symbols.sources.size() > kMaxCacheSources ||
        (!symbols.has_dwarf && debuginfod_configured()) || !open_dir())
        return;
    std::string name = file_name(module);
    try {
        write_file_atomically_at(dir_fd_.get(), name,
                                 encode_framed(dir_ + "/" + name, kSymbolCacheKind, symbols.encode(module)),
                                 dir_ + "/" + name);
    } catch (const Error&) {
        return;
    }
    prune();
}

namespace {

// A temporary file of write_file_atomically_at ("NAME.tmpDIGITS") that a
// command killed between its write and its rename left behind: the
// caller's own, and untouched for an hour (a write under way is newer).
bool stale_temporary(const std::string& name, const struct stat& st, const struct timespec& now) {
    size_t at = name.rfind(std::string(kSuffix) + ".tmp");
    if (at == std::string::npos) return false;
    size_t digits = at + std::strlen(kSuffix) + 4;
    if (digits == name.size() || name.find_first_not_of("0123456789", digits) != std::string::npos) return false;
    return S_ISREG(st.st_mode) && st.st_uid == geteuid() && now.tv_sec - st.st_mtim.tv_sec > 3600;
}

}  // namespace

// The cache's files by last use, and their total size; past
// kMaxCacheBytes, the oldest go until three quarters are left. Stale
// temporary files go in any case.
void SymbolCache::prune() {
    int listing = openat(dir_fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR* dir = listing >= 0 ? fdopendir(listing) : nullptr;  // which owns it then
    if (!dir) {
        if (listing >= 0) close(listing);
        return;
    }
    struct File {
        uint64_t used_ns;
        uint64_t bytes;
        std::string name;
    };
    std::vector<File> files;
    uint64_t total = 0;
    struct timespec now {};
    clock_gettime(CLOCK_REALTIME, &now);
    while (dirent* entry = readdir(dir)) {
        std::string name = entry->d_name;
        struct stat st;
        if (fstatat(dirfd(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (stale_temporary(name, st, now)) {
            unlinkat(dirfd(dir), name.c_str(), 0);
            continue;
        }
        if (!name.ends_with(kSuffix) || !S_ISREG(st.st_mode)) continue;
        files.push_back(File{nanoseconds(st.st_mtim), static_cast<uint64_t>(st.st_size), name});
        total += static_cast<uint64_t>(st.st_size);
    }
    closedir(dir);
    if (total <= kMaxCacheBytes) return;
    std::sort(files.begin(), files.end(), [](const File& a, const File& b) { return a.used_ns < b.used_ns; });
    for (const File& file : files) {
        if (total <= kMaxCacheBytes / 4 * 3) break;
        if (unlinkat(dir_fd_.get(), file.name.c_str(), 0) == 0) total -= file.bytes;
    }
}

std::string symbol_cache_dir_from_environment() {
    const char* chosen = std::getenv("HEAPSNAP_SYMBOL_CACHE");
    if (chosen && std::string(chosen) == "0") return "";
    if (chosen && chosen[0] == '/') return chosen;
    if (chosen && *chosen)
        warn(std::string("HEAPSNAP_SYMBOL_CACHE=") + chosen +
             ": neither 0 nor an absolute directory; the default cache is used");
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') return std::string(xdg) + "/heapsnap/symbols";
    const char* home = std::getenv("HOME");
    if (home && home[0] == '/') return std::string(home) + "/.cache/heapsnap/symbols";
    return "";
}

}  // namespace heapsnap
