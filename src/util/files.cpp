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

// Reads what `fd` holds (a regular file) and closes it.
std::vector<uint8_t> read_all(int fd, const std::string& path) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        throw Error(path + ": not a regular file");
    }
    std::vector<uint8_t> data(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < data.size()) {
        ssize_t r = read(fd, data.data() + got, data.size() - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += static_cast<size_t>(r);
    }
    close(fd);
    data.resize(got);
    return data;
}

}  // namespace

std::vector<uint8_t> read_file(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(path + ": " + std::strerror(errno));
    return read_all(fd, path);
}

std::vector<uint8_t> read_file_at(int dir, const std::string& name, const std::string& shown) {
    int fd = openat(dir, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) throw Error(shown + ": " + std::strerror(errno));
    return read_all(fd, shown);
}

void write_file_atomically_at(int dir, const std::string& name, const std::vector<uint8_t>& data,
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
    if (close(fd) != 0 || renameat(dir, tmp.c_str(), dir, name.c_str()) != 0) {
        int err = errno;
        unlinkat(dir, tmp.c_str(), 0);
        throw Error(shown + ": " + std::strerror(err));
    }
}

void write_file_atomically(const std::string& path, const std::vector<uint8_t>& data) {
    write_file_atomically_at(AT_FDCWD, path, data, path);
}

}  // namespace heapsnap
