#include "format/framed_file.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "util/error.h"
#include "util/files.h"

namespace heapsnap {
namespace {

constexpr size_t kHeaderSize = 16;
// Refuse to inflate more than 1 GiB: a snapshot of a million live call
// sites with 64 frames each is about 350 MB. The read budget
// (util/read_budget.h) usually stops a body much earlier.
constexpr uint64_t kMaxBody = 1ull << 30;
constexpr uint64_t kFirstChunk = 1ull << 20;

}  // namespace

std::vector<uint8_t> encode_framed(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& body) {
    std::vector<uint8_t> file(kHeaderSize + ZSTD_compressBound(body.size()));
    codec::Writer h(file.data(), kHeaderSize);
    h.raw(kind.magic, 8);
    h.u32le(kind.version);
    h.u32le(0);
    // With a checksum, a flipped bit is reported as corruption instead of
    // decoding into plausible wrong numbers.
    std::unique_ptr<ZSTD_CCtx, decltype(&ZSTD_freeCCtx)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, 3);
    ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_checksumFlag, 1);
    size_t n =
        ZSTD_compress2(cctx.get(), file.data() + kHeaderSize, file.size() - kHeaderSize, body.data(), body.size());
    if (ZSTD_isError(n)) throw Error(path + ": compression failed: " + ZSTD_getErrorName(n));
    file.resize(kHeaderSize + n);
    return file;
}

void write_framed_file(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& body) {
    write_file_atomically(path, encode_framed(path, kind, body));
}

bool has_magic(const std::string& path, const char* magic) { return regular_file_starts_with(path, magic, 8); }

namespace {

std::vector<uint8_t> decode_body(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& file,
                                 MemoryCharge& held, uint32_t* version_read) {
    const std::string name = kind.name;
    if (file.size() < 8 || std::memcmp(file.data(), kind.magic, 8) != 0)
        throw Error(path + ": not a heapsnap " + name + " (bad magic)");
    if (file.size() < kHeaderSize) throw Error(path + ": truncated " + name + ": the header is incomplete");
    codec::Reader h(file.data() + 8, kHeaderSize - 8);
    uint32_t version = h.u32le();
    uint32_t oldest = kind.oldest_version ? kind.oldest_version : kind.version;
    if (version < oldest || version > kind.version)
        throw Error(path + ": unsupported " + name + " format version " + std::to_string(version) +
                    (oldest == kind.version ? " (this heapsnap reads version " + std::to_string(kind.version) + ")"
                                            : " (this heapsnap reads versions " + std::to_string(oldest) + " to " +
                                                  std::to_string(kind.version) + ")"));
    if (version_read) *version_read = version;
    const uint8_t* frame = file.data() + kHeaderSize;
    size_t frame_size = file.size() - kHeaderSize;
    size_t compressed = ZSTD_findFrameCompressedSize(frame, frame_size);
    unsigned long long content = ZSTD_getFrameContentSize(frame, frame_size);
    if (ZSTD_isError(compressed) || content == ZSTD_CONTENTSIZE_ERROR) {
        if (content != ZSTD_CONTENTSIZE_ERROR) throw Error(path + ": truncated " + name);
        throw Error(path + ": corrupt " + name + ": bad compressed body");
    }
    if (compressed != frame_size) throw Error(path + ": corrupt " + name + ": trailing bytes after the body");
    if (content == ZSTD_CONTENTSIZE_UNKNOWN || content > kMaxBody)
        throw Error(path + ": corrupt " + name + ": bad body size");
    // The announced size is only a claim: a 33-byte file may announce 1 GiB.
    // Decompress in steps and grow the buffer with what actually comes out,
    // each step charged to the read budget before it is allocated.
    std::unique_ptr<ZSTD_DCtx, decltype(&ZSTD_freeDCtx)> dctx(ZSTD_createDCtx(), ZSTD_freeDCtx);
    auto grow = [&](std::vector<uint8_t>& body, uint64_t size) {
        budget_take_volume(size - body.size());
        held.take(size - body.size(), "the decompressed body");
        body.resize(size);
    };
    std::vector<uint8_t> body;
    grow(body, std::min<uint64_t>(content, kFirstChunk));
    ZSTD_inBuffer in{frame, compressed, 0};
    size_t got = 0;
    for (;;) {
        ZSTD_outBuffer out{body.data(), body.size(), got};
        size_t left = ZSTD_decompressStream(dctx.get(), &out, &in);
        got = out.pos;
        if (ZSTD_isError(left)) throw Error(path + ": corrupt " + name + ": body does not decompress");
        if (left == 0) break;  // the frame is complete, checksum verified
        if (got == body.size()) {
            if (body.size() == content) throw Error(path + ": corrupt " + name + ": body larger than announced");
            grow(body, std::min<uint64_t>(content, body.size() * 2));
        } else if (in.pos == in.size) {
            throw Error(path + ": corrupt " + name + ": body does not decompress");
        }
    }
    if (got != content) throw Error(path + ": corrupt " + name + ": body does not decompress");
    return body;
}

}  // namespace

std::vector<uint8_t> read_framed_file(const std::string& path, const FileKind& kind, MemoryCharge& held,
                                      uint32_t* version) {
    UniqueFd fd = open_regular_file(path);
    budget_add_input(fd.get());
    return decode_framed(path, kind, read_open_file(fd.get(), path), held, version);
}

std::vector<uint8_t> decode_framed(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& file,
                                   MemoryCharge& held, uint32_t* version) {
    try {
        return decode_body(path, kind, file, held, version);
    } catch (const BudgetExceeded& e) {
        throw Error(path + ": reading it " + e.what());
    }
}

}  // namespace heapsnap
