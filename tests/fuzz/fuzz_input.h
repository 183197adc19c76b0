// Shared by the fuzz targets: the bytes of one input as a file the readers
// can open by path, without touching the disk for every input.
//
// The decoders take paths (they map or read whole files, like the CLI), so
// each input is written into one memfd that lives for the whole run and
// read back through /proc/self/fd/N. Output files (snapshots written and
// read back) go to a private temporary directory removed at exit.
#pragma once

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <zstd.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace heapsnap::fuzz {

class InputFile {
public:
    InputFile() {
        fd_ = memfd_create("heapsnap-fuzz-input", MFD_CLOEXEC);
        if (fd_ < 0) {
            std::perror("memfd_create");
            std::abort();
        }
        path_ = "/proc/self/fd/" + std::to_string(fd_);
    }
    const std::string& write(const uint8_t* data, size_t size) {
        if (ftruncate(fd_, 0) != 0) std::abort();
        size_t done = 0;
        while (done < size) {
            ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
            if (n <= 0) std::abort();
            done += static_cast<size_t>(n);
        }
        return path_;
    }

private:
    int fd_ = -1;
    std::string path_;
};

// Two kinds of input, so that mutations reach the record decoders and not
// only the container: a zstd frame's checksum rejects almost every mutated
// byte of a real file.
//   - anything else: the whole file, as it would be on disk;
//   - 'R' + payload: the uncompressed content; the target wraps it into a
//     well-formed file (header with `magic` and `version`, then one zstd
//     frame with a checksum), as a writer with a bug would produce it.
inline bool is_raw(const uint8_t* data, size_t size) { return size > 0 && data[0] == 'R'; }

inline std::vector<uint8_t> wrap(const char* magic, uint32_t version, const uint8_t* payload, size_t size) {
    std::vector<uint8_t> out(16 + ZSTD_compressBound(size));
    std::memcpy(out.data(), magic, 8);
    for (int i = 0; i < 4; ++i) out[8 + i] = static_cast<uint8_t>(version >> (8 * i));
    std::memset(out.data() + 12, 0, 4);
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    size_t n = ZSTD_compress2(c, out.data() + 16, out.size() - 16, payload, size);
    ZSTD_freeCCtx(c);
    if (ZSTD_isError(n)) std::abort();
    out.resize(16 + n);
    return out;
}

// A JSON document as the CLI prints it (cli::json_text): invalid UTF-8
// replaced, never an exception.
inline std::string as_printed(const nlohmann::json& doc) {
    return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

// A directory of our own for files the targets write.
inline const std::string& scratch_dir() {
    static const std::string dir = [] {
        char tmpl[] = "/tmp/heapsnap-fuzz.XXXXXX";
        if (!mkdtemp(tmpl)) std::abort();
        std::string d = tmpl;
        static std::string to_remove;
        to_remove = d;
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(to_remove, ec);
        });
        return d;
    }();
    return dir;
}

// The readers must never need more than this for inputs of the sizes
// fuzzed (a few MiB at most): more is an unbounded allocation.
inline constexpr size_t kMemoryLimit = size_t{2} << 30;

}  // namespace heapsnap::fuzz
