// Little-endian varint codec shared by the recorder (writer side) and the
// CLI (reader side) of every heapsnap file format.
//
// Why varints: most fields of a log record are small (sizes below 4 KiB,
// stack and allocation-info ids below a million), so an unsigned LEB128 encoding
// keeps a typical allocation record at 3-4 bytes before zstd. Signed quantities (address deltas) are zigzag-encoded first.
//
// The encoder writes into a caller-owned byte span and never allocates, so
// the recorder can use it from inside malloc. The decoder is bounds-checked:
// it reports malformed input through `ok()` instead of reading past the end,
// because every decoder here faces truncated or hostile files.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace heapsnap::codec {

// The longest encoding of a 64-bit varint.
inline constexpr size_t kMaxVarint = 10;

inline uint64_t zigzag(int64_t v) { return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63); }
inline int64_t unzigzag(uint64_t v) { return static_cast<int64_t>(v >> 1) ^ -static_cast<int64_t>(v & 1); }

// Appends to a fixed buffer. The caller reserves enough room up front
// (records have a known worst-case size), so put_* does not check bounds;
// `room()` lets the caller decide when to flush.
class Writer {
public:
    Writer(uint8_t* begin, size_t capacity) : begin_(begin), pos_(begin), end_(begin + capacity) {}

    void u8(uint8_t v) { *pos_++ = v; }
    void varint(uint64_t v) {
        while (v >= 0x80) {
            *pos_++ = static_cast<uint8_t>(v) | 0x80;
            v >>= 7;
        }
        *pos_++ = static_cast<uint8_t>(v);
    }
    void svarint(int64_t v) { varint(zigzag(v)); }
    void u32le(uint32_t v) {
        for (int i = 0; i < 4; ++i) *pos_++ = static_cast<uint8_t>(v >> (8 * i));
    }
    void u64le(uint64_t v) {
        for (int i = 0; i < 8; ++i) *pos_++ = static_cast<uint8_t>(v >> (8 * i));
    }
    void bytes(const void* data, size_t n) {
        varint(n);
        if (n) std::memcpy(pos_, data, n);  // data may be null when n is 0
        pos_ += n;
    }
    void str(std::string_view s) { bytes(s.data(), s.size()); }
    void raw(const void* data, size_t n) {
        if (n) std::memcpy(pos_, data, n);
        pos_ += n;
    }

    size_t size() const { return static_cast<size_t>(pos_ - begin_); }
    size_t room() const { return static_cast<size_t>(end_ - pos_); }
    uint8_t* data() const { return begin_; }
    void reset() { pos_ = begin_; }

private:
    uint8_t* begin_;
    uint8_t* pos_;
    uint8_t* end_;
};

// Reads from a byte span. After the first malformed or truncated field every
// getter returns 0 / empty and `ok()` stays false, so a decoder can read a
// whole record and check once.
class Reader {
public:
    Reader(const uint8_t* begin, size_t size) : pos_(begin), end_(begin + size) {}

    bool ok() const { return ok_; }
    bool at_end() const { return pos_ >= end_; }
    size_t remaining() const { return static_cast<size_t>(end_ - pos_); }
    const uint8_t* position() const { return pos_; }

    uint8_t u8() {
        if (pos_ >= end_) return fail();
        return *pos_++;
    }
    uint64_t varint() {
        // Most fields are one byte; replay reads hundreds of millions.
        if (pos_ < end_ && !(*pos_ & 0x80)) [[likely]]
            return *pos_++;
        if (remaining() >= 8) [[likely]]
            if (uint64_t v; short_varint(v)) return v;
        uint64_t v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            if (pos_ >= end_) return fail();
            uint8_t b = *pos_++;
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return v;
        }
        return fail();
    }
    int64_t svarint() { return unzigzag(varint()); }
    uint32_t u32le() {
        if (remaining() < 4) return fail();
        uint32_t v = 0;
        for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(*pos_++) << (8 * i);
        return v;
    }
    uint64_t u64le() {
        if (remaining() < 8) return fail();
        uint64_t v = 0;
        for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(*pos_++) << (8 * i);
        return v;
    }
    // A length-prefixed string; the view points into the buffer.
    std::string_view str() {
        uint64_t n = varint();
        if (!ok_ || n > remaining()) {
            fail();
            return {};
        }
        std::string_view s(reinterpret_cast<const char*>(pos_), n);
        pos_ += n;
        return s;
    }
    // The same, refused (the input is corrupt) when longer than `max`: the
    // most any writer puts there.
    std::string_view str(size_t max) {
        std::string_view s = str();
        if (s.size() > max) {
            fail();
            return {};
        }
        return s;
    }
    // A count that announces how many items follow; each item needs at least
    // `min_item_bytes`, so a count larger than the rest of the buffer could
    // hold, or than `max`, is corrupt and must not drive an allocation.
    uint64_t count(size_t min_item_bytes, uint64_t max = UINT64_MAX) {
        uint64_t n = varint();
        if (ok_ && ((min_item_bytes && n > remaining() / min_item_bytes) || n > max)) fail();
        return ok_ ? n : 0;
    }

    // Steps over `n` varints, as many varint() calls would, without their
    // values: a Stack record's frames, which the replay keeps as they are.
    // Eight bytes at a time where eight are left: a byte whose top bit is
    // clear ends a varint, so a word's last bytes are counted with one
    // multiplication, and a varint may not go on for more than kMaxVarint bytes
    // (`run`: its bytes so far, across words).
    void skip_varints(uint64_t n) {
        constexpr uint64_t kTops = 0x8080808080808080ull;
        uint64_t run = 0;
#if defined(__SSE2__)
        while (n && remaining() >= 64 && skip_varints_in_64(n, run)) {
        }
        if (!n) return;
#endif
        if constexpr (std::endian::native == std::endian::little) {
            while (n && remaining() >= 8) {
                uint64_t x;
                std::memcpy(&x, pos_, 8);
                uint64_t last = ~x & kTops;
                if (!last) {
                    run += 8;
                    if (run >= kMaxVarint) break;  // the bytewise loop fails it
                    pos_ += 8;
                    continue;
                }
                if (run + static_cast<uint64_t>(std::countr_zero(last)) / 8 >= kMaxVarint) break;
                uint64_t ends = ((last >> 7) * 0x0101010101010101ull) >> 56;  // a popcount without POPCNT
                if (ends >= n) {
                    for (uint64_t i = 1; i < n; ++i) last &= last - 1;  // the n-th end is the lowest left
                    pos_ += std::countr_zero(last) / 8 + 1;
                    return;
                }
                n -= ends;
                run = 7 - static_cast<uint64_t>(63 - std::countl_zero(last)) / 8;  // bytes after the last end
                pos_ += 8;
            }
        }
        while (n) {
            if (pos_ >= end_ || run == kMaxVarint) {
                fail();
                return;
            }
            if (*pos_++ & 0x80) {
                run++;
            } else {
                run = 0;
                n--;
            }
        }
    }

#if defined(__SSE2__)
    // skip_varints on the next 64 bytes: their top bits as a 64-bit mask of
    // continuation bytes (one SSE2 instruction per 16), the ends counted per
    // byte of the mask and summed with one multiplication, a run of
    // kMaxVarint continuation bytes found with four shifts. Steps over the
    // block and returns true while more ends are wanted; stops on the n-th
    // end (n becomes 0); returns false without moving where a varint is
    // too long, for the bytewise loop to fail at the same byte.
    bool skip_varints_in_64(uint64_t& n, uint64_t& run) {
        auto top_bits = [&](int at) {
            __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(pos_ + at));
            return static_cast<uint64_t>(static_cast<uint16_t>(_mm_movemask_epi8(v))) << at;
        };
        uint64_t more = top_bits(0) | top_bits(16) | top_bits(32) | top_bits(48);  // bit i: byte i goes on
        uint64_t ends = ~more;
        uint64_t c = ends - ((ends >> 1) & 0x5555555555555555ull);
        c = (c & 0x3333333333333333ull) + ((c >> 2) & 0x3333333333333333ull);
        c = (c + (c >> 4)) & 0x0f0f0f0f0f0f0f0full;
        uint64_t upto = c * 0x0101010101010101ull;  // byte i: the ends in mask bytes 0..i
        uint64_t total = upto >> 56;
        uint64_t last = 63;  // the last byte that counts
        uint64_t counted = more;
        if (total >= n) {
            // The first byte of `upto` that reaches n (bytes are at most 64:
            // no borrow crosses one), then the end in that byte.
            uint64_t reached = ((upto | 0x8080808080808080ull) - n * 0x0101010101010101ull) & 0x8080808080808080ull;
            int lane = std::countr_zero(reached) / 8;
            uint64_t before = lane ? (upto >> (8 * (lane - 1))) & 0xff : 0;
            uint64_t bits = (ends >> (8 * lane)) & 0xff;
            for (uint64_t i = before + 1; i < n; ++i) bits &= bits - 1;
            last = 8 * static_cast<uint64_t>(lane) + static_cast<uint64_t>(std::countr_zero(bits));
            counted = last == 63 ? more : more & ((uint64_t{2} << last) - 1);
        }
        uint64_t two = counted & (counted >> 1);  // bit i: bytes i to i+1 go on
        uint64_t eight = two & (two >> 2);
        eight &= eight >> 4;
        if (run + static_cast<uint64_t>(std::countr_one(counted)) >= kMaxVarint || (eight & (two >> 8))) return false;
        if (total >= n) {
            pos_ += last + 1;
            n = 0;
            return false;
        }
        n -= total;
        run = static_cast<uint64_t>(std::countl_one(more));
        pos_ += 64;
        return true;
    }
#endif

    // Marks the input corrupt (a field decoded but its value is impossible).
    void invalidate() { fail(); }

private:
    // A varint of 2 to 8 bytes without a loop or a branch per byte (the
    // stack frames' addresses, 3 to 5 bytes each): the eight bytes at pos_
    // as one little-endian word, the length from the first byte whose top
    // bit is clear, then the 7-bit groups of that many bytes packed
    // together in three steps. False, with nothing read, for a longer one;
    // the caller has checked that eight bytes are there.
    bool short_varint(uint64_t& v) {
        if constexpr (std::endian::native != std::endian::little) return false;
        uint64_t x;
        std::memcpy(&x, pos_, 8);
        uint64_t last = ~x & 0x8080808080808080ull;
        if (!last) return false;
        int bits = std::countr_zero(last) + 1;  // through the top bit of the last byte
        if (bits < 64) x &= (uint64_t{1} << bits) - 1;
        x = ((x & 0x7f007f007f007f00ull) >> 1) | (x & 0x007f007f007f007full);
        x = ((x & 0x3fff00003fff0000ull) >> 2) | (x & 0x00003fff00003fffull);
        x = ((x & 0x0fffffff00000000ull) >> 4) | (x & 0x000000000fffffffull);
        v = x;
        pos_ += bits / 8;
        return true;
    }
    uint8_t fail() {
        ok_ = false;
        pos_ = end_;
        return 0;
    }
    const uint8_t* pos_;
    const uint8_t* end_;
    bool ok_ = true;
};

}  // namespace heapsnap::codec
