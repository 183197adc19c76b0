#include "util/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "util/error.h"

namespace heapsnap {

std::string basename_of(const std::string& path) {
    size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

namespace {

const char* kind_of(mode_t mode) {
    switch (mode & S_IFMT) {
        case S_IFIFO: return "a FIFO";
        case S_IFCHR: return "a character device";
        case S_IFBLK: return "a block device";
        case S_IFSOCK: return "a socket";
        case S_IFDIR: return "a directory";
        case S_IFLNK: return "a symbolic link";
        default: return "of an unknown type";
    }
}

// Reads what `fd` holds (a regular file).
std::vector<uint8_t> read_all(int fd, const std::string& path) {
    struct stat st;
    if (fstat(fd, &st) != 0) throw Error(path + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw Error(path + ": not a regular file (" + kind_of(st.st_mode) + ")");
    std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < data.size()) {
        ssize_t r = read(fd, data.data() + got, data.size() - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += static_cast<size_t>(r);
    }
    data.resize(got);
    return data;
}

}  // namespace

void check_regular_file(int fd, const std::string& shown) {
    struct stat st;
    if (fstat(fd, &st) != 0) throw Error(shown + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) throw Error(shown + ": not a regular file (" + kind_of(st.st_mode) + ")");
}

UniqueFd open_regular_file(const std::string& path) {
    // O_NONBLOCK: open() of a FIFO returns at once instead of waiting for
    // a writer; it changes nothing for a regular file.
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (!fd) {
        int err = errno;
        struct stat st;  // a socket cannot be opened at all (ENXIO): say what it is
        if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
            throw Error(path + ": not a regular file (" + kind_of(st.st_mode) + ")");
        throw Error(path + ": " + std::strerror(err));
    }
    check_regular_file(fd.get(), path);
    return fd;
}

bool regular_file_starts_with(const std::string& path, const void* magic, size_t size) {
    try {
        UniqueFd fd = open_regular_file(path);
        std::vector<char> head(size);
        return pread(fd.get(), head.data(), size, 0) == static_cast<ssize_t>(size) &&
               std::memcmp(head.data(), magic, size) == 0;
    } catch (const Error&) {
        return false;
    }
}

std::vector<uint8_t> read_open_file(int fd, const std::string& shown) { return read_all(fd, shown); }

std::vector<uint8_t> read_file(const std::string& path) { return read_all(open_regular_file(path).get(), path); }

FileStamp stamp_of(const struct stat& st) {
    return FileStamp{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

FileStamp write_file_atomically_at(int dir, const std::string& name, const std::vector<uint8_t>& data,
                                   const std::string& shown) {
    std::random_device entropy;
    std::string tmp;
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
        tmp = name + ".tmp" + std::to_string(entropy());
        fd = openat(dir, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) throw Error(shown + ": " + std::strerror(errno));
    fchmod(fd, 0600);  // whatever the umask took away
    size_t done = 0;
    while (done < data.size()) {
        ssize_t w = write(fd, data.data() + done, data.size() - done);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            int err = errno;
            close(fd);
            unlinkat(dir, tmp.c_str(), 0);
            throw Error(shown + ": " + std::strerror(err));
        }
        done += static_cast<size_t>(w);
    }
    struct stat st {};
    bool known = fstat(fd, &st) == 0;
    if (close(fd) != 0 || !known || renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) {
        int err = errno;
        unlinkat(dir, tmp.c_str(), 0);
        throw Error(shown + ": " + std::strerror(err));
    }
    return stamp_of(st);
}

void write_file_atomically(const std::string& path, const std::vector<uint8_t>& data) {
    write_file_atomically_at(AT_FDCWD, path, data, path);
}

}  // namespace heapsnap
