// Small file helpers shared by the CLI: whole-file reads and the safe way
// to create output files (never following a symlink, mode 0600, never
// exposing a half-written file).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace heapsnap {

// The last component of a path: "libc.so.6" of "/usr/lib/libc.so.6"; the
// path itself if it has no '/'.
std::string basename_of(const std::string& path);

// Owns a descriptor (-1: none) and closes it when it goes.
class UniqueFd {
public:
    UniqueFd() = default;
    explicit UniqueFd(int fd) : fd_(fd) {}
    UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    UniqueFd& operator=(UniqueFd&& other) noexcept {
        if (this != &other) reset(std::exchange(other.fd_, -1));
        return *this;
    }
    ~UniqueFd() { reset(); }
    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    void reset(int fd = -1) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = fd;
    }

private:
    int fd_ = -1;
};

// Opens `path` read-only without blocking, and refuses anything but a
// regular file: a FIFO blocks open() until a writer comes, a terminal or
// a device blocks read() for ever. Throws heapsnap::Error "<path>:
// <strerror>" or "<path>: not a regular file (a FIFO)". Every reader of a
// log, snapshot or checkpoint opens its file this way.
UniqueFd open_regular_file(const std::string& path);
// The same for a descriptor already open (passed by a recorder).
void check_regular_file(int fd, const std::string& shown);
// Whether `path` is a regular file that starts with `magic`; never blocks.
bool regular_file_starts_with(const std::string& path, const void* magic, size_t size);

// Reads the whole file (open_regular_file); throws heapsnap::Error.
std::vector<uint8_t> read_file(const std::string& path);
// The whole of `fd`, a file already open: refused unless it is a regular
// file; `shown` names it in messages.
std::vector<uint8_t> read_open_file(int fd, const std::string& shown);

// Which file a name held when it was looked at. A file written anew and
// renamed over the name (write_file_atomically) has another inode than
// the one it replaced, which lived until the rename.
struct FileStamp {
    uint64_t device = 0;
    uint64_t inode = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileStamp&) const = default;
};
FileStamp stamp_of(const struct stat& st);

// Writes `data` to a fresh temporary file next to `path` (O_EXCL, 0600
// whatever the umask),
// then renames it over `path`. Throws heapsnap::Error.
void write_file_atomically(const std::string& path, const std::vector<uint8_t>& data);
// The same for `name` in the directory `dir`: a directory renamed or
// replaced by a symlink meanwhile does not redirect the write. Returns
// the stamp of the file written.
FileStamp write_file_atomically_at(int dir, const std::string& name, const std::vector<uint8_t>& data,
                                   const std::string& shown);

}  // namespace heapsnap
