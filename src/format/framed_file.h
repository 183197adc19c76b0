// The container shared by heapsnap's whole-file formats (.hsnap, and the
// replay checkpoint): a 16-byte header (8-byte magic, u32le version,
// u32le 0) and one zstd frame with a checksum holding the body. Written to
// a temporary file and renamed into place; read back with one clear error
// for every way a file can be wrong (formats/hsnap.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/codec.h"
#include "util/read_budget.h"

namespace heapsnap {

struct FileKind {
    const char* magic;  // 8 bytes
    uint32_t version;
    const char* name;             // "snapshot", used in messages
    uint32_t oldest_version = 0;  // the oldest version read too; 0: `version` only
};

void write_framed_file(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& body);
// Throws heapsnap::Error: "<path>: not a heapsnap <name> (bad magic)",
// "unsupported <name> format version N", "truncated <name>", "corrupt <name>: ...".
// The body, decompressed in steps charged to the read budget
// (util/read_budget.h): to `held` for its memory, which the caller gives
// back when it lets the body go; "<path>: ..." when the budget is spent.
// `version`, if given, receives the file's version.
std::vector<uint8_t> read_framed_file(const std::string& path, const FileKind& kind, MemoryCharge& held,
                                      uint32_t* version = nullptr);
// The same two on the bytes of a whole file, for callers that open files
// their own way; `path` names the file in messages.
std::vector<uint8_t> encode_framed(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& body);
std::vector<uint8_t> decode_framed(const std::string& path, const FileKind& kind, const std::vector<uint8_t>& file,
                                   MemoryCharge& held, uint32_t* version = nullptr);
bool has_magic(const std::string& path, const char* magic);

// A growable encoder for the CLI side, with the same field encodings as
// codec::Writer.
class ByteBuffer {
public:
    void u8(uint8_t v) { bytes_.push_back(v); }
    void varint(uint64_t v) {
        uint8_t tmp[codec::kMaxVarint];
        codec::Writer w(tmp, sizeof tmp);
        w.varint(v);
        bytes_.insert(bytes_.end(), tmp, tmp + w.size());
    }
    void str(std::string_view s) {
        varint(s.size());
        bytes_.insert(bytes_.end(), s.begin(), s.end());
    }
    std::vector<uint8_t>& bytes() { return bytes_; }

private:
    std::vector<uint8_t> bytes_;
};

}  // namespace heapsnap
