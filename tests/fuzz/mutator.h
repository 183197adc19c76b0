// A structure-aware mutator for .hslog logs and .hsnap snapshots: it
// decompresses, mutates what is inside, and compresses again with a valid
// checksum, so that every mutation reaches the decoders (a byte flipped in
// a compressed file only ever tests the checksum).
//
// Logs are cut into frames and each frame's payload into records (the
// grammar of formats/hslog.md, enough of it to find where each record
// ends); a mutation then works on records: repeat one many times (the
// small file that describes a lot), drop, swap or copy one, set one of its
// numbers to a value at an edge (0, 1, 2^32, 2^63...), cut one short, or
// move a frame boundary. Snapshot bodies have no records: their numbers
// (varints) are the unit. Payloads that do not split (a mutated seed
// already broken) get the same treatment at byte level.
//
// Used by libFuzzer as LLVMFuzzerCustomMutator (fuzz_log.cpp,
// fuzz_snapshot.cpp under tools/fuzz) and by fuzz_mutate.cpp, which runs a
// fixed number of mutated cases in `meson test` (suite fuzz).
#pragma once

#include <zstd.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "format/codec.h"
#include "format/hslog.h"

namespace heapsnap::fuzz {

using Bytes = std::vector<uint8_t>;
using Rng = std::mt19937_64;

inline Bytes compress_frame(const Bytes& payload) {
    Bytes out(ZSTD_compressBound(payload.size()));
    ZSTD_CCtx* c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    size_t n = ZSTD_compress2(c, out.data(), out.size(), payload.data(), payload.size());
    ZSTD_freeCCtx(c);
    if (ZSTD_isError(n)) return {};
    out.resize(n);
    return out;
}

// The payloads of the complete frames at `data` (after a 16-byte header);
// false if something there is not a frame this mutator can take apart.
inline bool decompress_frames(const uint8_t* data, size_t size, std::vector<Bytes>& out) {
    while (size) {
        size_t n = ZSTD_findFrameCompressedSize(data, size);
        unsigned long long content = ZSTD_getFrameContentSize(data, size);
        if (ZSTD_isError(n) || content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN ||
            content > (4u << 20))
            return false;
        Bytes payload(content);
        if (ZSTD_decompress(payload.data(), payload.size(), data, n) != content) return false;
        out.push_back(std::move(payload));
        data += n;
        size -= n;
    }
    return true;
}

// Where the records of a log payload start (and one past the last end);
// empty if a record does not parse.
inline std::vector<size_t> record_starts(const Bytes& payload) {
    using hslog::Tag;
    std::vector<size_t> starts;
    codec::Reader r(payload.data(), payload.size());
    auto varints = [&](int n) {
        for (int i = 0; i < n; ++i) r.varint();
    };
    while (!r.at_end() && r.ok()) {
        starts.push_back(static_cast<size_t>(r.position() - payload.data()));
        uint8_t tag = r.u8();
        if (tag >= 0x80) {
            r.u8();
        } else if (tag >= 0x30 && tag < 0x30 + hslog::kAllocFnCount) {
            varints(2);
        } else if (tag >= 0x40 && tag < 0x40 + hslog::kAllocFnCount) {
            varints(3);
        } else if (tag >= 0x50 && tag < 0x70) {
        } else {
            switch (static_cast<Tag>(tag)) {
                case Tag::Process: r.str(), varints(6), r.u8(), varints(1), r.str(), r.str(), varints(1), r.u8(); break;
                case Tag::ModuleLoad: varints(5), r.str(), r.str(); break;
                case Tag::ModuleUnload: varints(2); break;
                case Tag::Stack: {
                    r.varint();
                    uint64_t n = r.count(2);
                    varints(static_cast<int>(2 * n));
                    break;
                }
                case Tag::Thread:
                case Tag::Time:
                case Tag::AllocInfo:
                case Tag::Free:
                case Tag::FreeAt: varints(1); break;
                case Tag::FreeUnknown: varints(2); break;
                case Tag::ThreadStart: varints(5); break;
                case Tag::ThreadExit: varints(2); break;
                case Tag::Mmap: varints(5); break;
                case Tag::Munmap: varints(2); break;
                case Tag::End: r.varint(), r.u8(), r.varint(); break;
                case Tag::Marker: {
                    varints(4), r.u8(), r.str(), varints(3);
                    uint8_t stats = r.u8();
                    if (stats == 1) varints(7);
                    if (stats == 2) {
                        r.u8();
                        uint8_t present = r.u8();
                        for (int i = 0; i < 5; ++i)
                            if (present & (1u << i)) r.varint();
                    }
                    uint32_t regions = r.u32le();
                    for (uint32_t i = 0; i < regions && r.ok(); ++i)
                        varints(2), r.u8(), r.u8(), varints(2), r.str(), varints(4);
                    break;
                }
                default: return {};
            }
        }
    }
    if (!r.ok()) return {};
    starts.push_back(payload.size());
    return starts;
}

// A number at an edge, for a field.
inline uint64_t edge_value(Rng& rng) {
    static const uint64_t kEdges[] = {0,          1,         2,          255,        256,        65535,
                                      65536,      65537,     1u << 30,   UINT32_MAX, 1ull << 32, 1ull << 40,
                                      1ull << 62, INT64_MAX, UINT64_MAX, 16u << 20,  4096,       (1ull << 30) - 1};
    return kEdges[rng() % (sizeof kEdges / sizeof kEdges[0])];
}

inline Bytes varint_bytes(uint64_t v) {
    uint8_t tmp[codec::kMaxVarint];
    codec::Writer w(tmp, sizeof tmp);
    w.varint(v);
    return Bytes(tmp, tmp + w.size());
}

// Replaces the varint at a random position of [begin, end) of `bytes`
// (a byte that ends one, as the decoders read them) with an edge value.
inline void set_a_number(Bytes& bytes, size_t begin, size_t end, Rng& rng) {
    if (end <= begin) return;
    size_t at = begin + rng() % (end - begin);
    size_t stop = at;
    while (stop < end && (bytes[stop] & 0x80)) ++stop;
    if (stop == end) return;
    Bytes v = varint_bytes(edge_value(rng));
    bytes.erase(bytes.begin() + static_cast<long>(at), bytes.begin() + static_cast<long>(stop) + 1);
    bytes.insert(bytes.begin() + static_cast<long>(at), v.begin(), v.end());
}

// One mutation of a log payload, record-wise when it splits. The Process
// record first in the log is mostly left in place: without it a reader
// stops at once.
inline void mutate_payload(Bytes& p, Rng& rng, size_t max_growth, bool first_frame) {
    std::vector<size_t> starts = record_starts(p);
    if (starts.size() < 2) {  // no records to work with: bytes
        if (!p.empty()) set_a_number(p, 0, p.size(), rng);
        return;
    }
    size_t records = starts.size() - 1;
    size_t skip = first_frame && records > 1 && rng() % 8 ? 1 : 0;
    size_t i = skip + rng() % (records - skip), j = skip + rng() % (records - skip);
    Bytes rec_i(p.begin() + static_cast<long>(starts[i]), p.begin() + static_cast<long>(starts[i + 1]));
    switch (rng() % 6) {
        case 0: {  // repeat a record, up to many times: few compressed bytes, much to hold
            size_t times =
                1 + rng() % (rng() % 2 ? 4 : std::max<size_t>(1, max_growth / std::max<size_t>(1, rec_i.size())));
            Bytes many;
            for (size_t k = 0; k < times; ++k) many.insert(many.end(), rec_i.begin(), rec_i.end());
            p.insert(p.begin() + static_cast<long>(starts[i + 1]), many.begin(), many.end());
            break;
        }
        case 1:  // drop one
            p.erase(p.begin() + static_cast<long>(starts[i]), p.begin() + static_cast<long>(starts[i + 1]));
            break;
        case 2: {  // copy one elsewhere (a second Process, a Free before its Alloc...)
            p.insert(p.begin() + static_cast<long>(starts[j]), rec_i.begin(), rec_i.end());
            break;
        }
        case 3:  // a number of one record at an edge
            set_a_number(p, starts[i] + 1, starts[i + 1], rng);
            break;
        case 4:  // cut one short
            if (rec_i.size() > 1)
                p.erase(p.begin() + static_cast<long>(starts[i + 1] - 1 - rng() % (rec_i.size() - 1)),
                        p.begin() + static_cast<long>(starts[i + 1]));
            break;
        default: {  // a record of another kind in its place: a tag changed
            p[starts[i]] = static_cast<uint8_t>(rng());
            break;
        }
    }
}

// A mutated log: the same header, frames decompressed, mutated, split or
// joined, and compressed again. Empty if `file` is not a log it can take
// apart.
inline Bytes mutate_log(const Bytes& file, Rng& rng, size_t max_growth = 1u << 20) {
    if (file.size() < 16 || std::memcmp(file.data(), hslog::kMagic, 8) != 0) return {};
    std::vector<Bytes> frames;
    if (!decompress_frames(file.data() + 16, file.size() - 16, frames) || frames.empty()) return {};
    int rounds = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < rounds; ++k) {
        size_t f = rng() % frames.size();
        if (rng() % 8 == 0 && frames.size() > 1 && f + 1 < frames.size()) {  // join two frames
            frames[f].insert(frames[f].end(), frames[f + 1].begin(), frames[f + 1].end());
            frames.erase(frames.begin() + static_cast<long>(f) + 1);
        } else if (rng() % 8 == 0) {  // split one at a record boundary
            std::vector<size_t> starts = record_starts(frames[f]);
            if (starts.size() > 2) {
                size_t at = starts[1 + rng() % (starts.size() - 2)];
                Bytes tail(frames[f].begin() + static_cast<long>(at), frames[f].end());
                frames[f].resize(at);
                frames.insert(frames.begin() + static_cast<long>(f) + 1, std::move(tail));
            }
        } else {
            mutate_payload(frames[f], rng, max_growth, f == 0);
        }
    }
    Bytes out(file.begin(), file.begin() + 16);
    for (const Bytes& payload : frames) {
        if (payload.empty()) continue;  // the writer never writes an empty frame
        Bytes z = compress_frame(payload);
        out.insert(out.end(), z.begin(), z.end());
    }
    if (rng() % 16 == 0 && out.size() > 17) out.resize(out.size() - 1 - rng() % 8);  // cut inside the last frame
    return out;
}

// A mutated snapshot: its body decompressed, numbers set at edges and
// byte ranges repeated, compressed again.
inline Bytes mutate_snapshot(const Bytes& file, Rng& rng, size_t max_growth = 1u << 20) {
    if (file.size() < 16) return {};
    std::vector<Bytes> body;
    if (!decompress_frames(file.data() + 16, file.size() - 16, body) || body.size() != 1) return {};
    Bytes& b = body[0];
    int rounds = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < rounds && !b.empty(); ++k) {
        if (rng() % 3) {
            set_a_number(b, 0, b.size(), rng);
        } else {  // a range repeated: more entries, stacks or regions than the counts say
            size_t from = rng() % b.size();
            size_t len = 1 + rng() % std::min<size_t>(64, b.size() - from);
            size_t times = 1 + rng() % std::max<size_t>(1, max_growth / len / 16);
            Bytes range(b.begin() + static_cast<long>(from), b.begin() + static_cast<long>(from + len));
            Bytes many;
            for (size_t t = 0; t < times; ++t) many.insert(many.end(), range.begin(), range.end());
            b.insert(b.begin() + static_cast<long>(from + len), many.begin(), many.end());
        }
    }
    Bytes out(file.begin(), file.begin() + 16);
    Bytes z = compress_frame(b);
    out.insert(out.end(), z.begin(), z.end());
    return out;
}

}  // namespace heapsnap::fuzz
