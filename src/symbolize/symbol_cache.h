// The symbol cache: what the symbolizer found for a module's addresses,
// kept on disk per build-id so that the next diff or report of the same
// program opens none of its ELF and DWARF files (formats/symbol-cache.md).
//
// Why it is shaped this way:
//
// - Reading DWARF is most of a diff of a small program: libc's debug
//   file alone is 4 MB of zlib-compressed sections, inflated on every run.
//   The names of an address depend only on the files libdwfl reads for
//   it, so a file per (build-id, module path) holding the frames of every
//   address looked up so far answers a later run without libdwfl, if none
//   of those files changed.
// - A file's identity is its size, modification time and inode. The
//   module is compared by path; so are its separate debug files and the
//   places libdwfl would look for one (debug_sources.h), absent ones too:
//   installing a debug package changes the names, and must invalidate.
// - Only a module whose recorded build-id matched the file is cached, so
//   the frames belong to the code the process ran.
// - The cache is input like any other file: its directory must be the
//   caller's with mode 0700, a file is read only if it is a regular file
//   of the caller's with mode 0600 (opened without following a link and
//   without blocking), and every field is checked against the module and
//   the limits below. Anything else is ignored, with at most one warning
//   for the process, and the file is written anew: a cache costs speed,
//   never a result.
// - Written after the symbolizer's work, to a temporary file renamed over
//   the old one (O_EXCL | O_NOFOLLOW, 0600): two commands writing the same
//   file leave one of their versions, both complete. Past kMaxCacheBytes
//   in all, the files used least recently go.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "symbolize/symbolizer.h"
#include "util/files.h"

namespace heapsnap {

// Limits of one cache file; a file beyond them is corrupt, and a module
// that outgrows them keeps its further addresses out of the cache.
inline constexpr uint64_t kMaxCacheFileBytes = uint64_t{32} << 20;  // on disk
inline constexpr uint64_t kMaxCacheBodyBytes = uint64_t{64} << 20;  // decompressed
inline constexpr uint64_t kMaxCachedAddresses = uint64_t{1} << 20;
inline constexpr uint64_t kMaxCachedFrames = 256;  // of one address
inline constexpr uint64_t kMaxCachedString = 64 << 10;
inline constexpr uint64_t kMaxCacheSources = 256;
// All files together; pruning takes them down to three quarters of it.
inline constexpr uint64_t kMaxCacheBytes = uint64_t{256} << 20;

// A file as the cache compares it: absent, or its size, modification time
// (nanoseconds) and inode.
struct FileIdentity {
    std::string path;
    bool present = false;
    uint64_t size = 0;
    uint64_t mtime_ns = 0;
    uint64_t inode = 0;

    bool operator==(const FileIdentity&) const = default;
};

// The file `path` names now, following links as libdwfl's open does.
FileIdentity identity_of(const std::string& path);
// The file open as `fd`, named `path`.
FileIdentity identity_of(int fd, const std::string& path);

// One module's symbolized addresses: each string once, each address's
// frames as indices into them.
class ModuleSymbols {
public:
    ModuleSymbols() = default;
    ModuleSymbols(ModuleSymbols&&) = default;
    ModuleSymbols& operator=(ModuleSymbols&&) = default;
    ModuleSymbols(const ModuleSymbols&) = delete;  // string_ids_ views strings_
    ModuleSymbols& operator=(const ModuleSymbols&) = delete;

    // The module file first, then every other file its names depend on.
    std::vector<FileIdentity> sources;
    // Whether libdwfl found DWARF for it. Without it, a module is looked
    // up again when a debuginfod server might have it (DEBUGINFOD_URLS).
    bool has_dwarf = false;

    // The frames of `vaddr` if held (module and offset left empty).
    bool find(uint64_t vaddr, std::vector<SymbolFrame>& frames) const;
    // False, and nothing added, past the limits above.
    bool add(uint64_t vaddr, const std::vector<SymbolFrame>& frames);
    size_t size() const { return entries_.size(); }

    std::vector<uint8_t> encode(const ModuleRef& module) const;
    // The body of a cache file, if it is sound and for `module`.
    static std::optional<ModuleSymbols> decode(const std::vector<uint8_t>& body, const ModuleRef& module);

private:
    struct Frame {
        uint32_t function;
        uint32_t file;
        uint32_t line;
        bool inlined;
    };
    struct Entry {
        uint32_t first;
        uint32_t count;
    };

    uint32_t intern(const std::string& text);

    std::deque<std::string> strings_{""};  // a deque: string_ids_ views them
    std::unordered_map<std::string_view, uint32_t> string_ids_{{"", 0}};
    std::vector<Frame> frames_;
    std::unordered_map<uint64_t, Entry> entries_;
};

class SymbolCache {
public:
    // The cache in `dir`, created (mode 0700) if missing.
    explicit SymbolCache(std::string dir);

    // The symbols cached for `module`: none unless its file is sound, for
    // this build-id and path, and each of its sources unchanged.
    std::optional<ModuleSymbols> load(const ModuleRef& module);
    // Replaces the module's file, then prunes the cache if it grew past
    // kMaxCacheBytes. Never throws: a cache that cannot be written costs
    // speed, not results.
    void save(const ModuleRef& module, const ModuleSymbols& symbols);

private:
    bool open_dir();
    void prune();

    std::string dir_;
    UniqueFd dir_fd_;
    bool dir_tried_ = false;
};

// Where the environment puts the cache: HEAPSNAP_SYMBOL_CACHE if it names
// a directory, else $XDG_CACHE_HOME/heapsnap/symbols or
// ~/.cache/heapsnap/symbols; empty for HEAPSNAP_SYMBOL_CACHE=0 (no cache).
std::string symbol_cache_dir_from_environment();

}  // namespace heapsnap
