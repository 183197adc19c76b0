// The x86-64 .eh_frame CFI of a code address, as the row of register
// rules that DWARF's call frame instructions give it: for the CFA and for
// every register the System V ABI numbers 0 to 16 (16 is the return
// address, rip). Read through _dl_find_object, which is lock-free and
// async-signal-safe (unlike dl_iterate_phdr), from the loaded object's
// .eh_frame_hdr search table; nothing is allocated and nothing is cached
// here. Two users: frame_rules.cpp reduces a row to the three registers
// its fast walk follows and caches that, and cfi_walk.cpp steps every
// register with it where the reduction does not hold.
// Formats: the System V x86-64 ABI (.eh_frame_hdr, .eh_frame) and DWARF 5
// section 6.4 (call frame instructions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace heapsnap::recorder::cfi {

inline constexpr unsigned kRbp = 6, kRsp = 7, kRip = 16;  // DWARF register numbers
inline constexpr unsigned kRegisters = 17;

// Where the caller's value of one register is. An expression is the
// bytes [expr, expr + value) of the CFI (Row::at), evaluated with the CFA
// pushed first.
struct Rule {
    enum How : uint8_t {
        Same,           // unchanged
        Undefined,      // not recoverable (rip: the outermost frame)
        Offset,         // saved at CFA + value
        ValOffset,      // is CFA + value
        Register,       // is the callee's register `reg`
        Expression,     // saved at the address the expression computes
        ValExpression,  // is what the expression computes
    };
    How how = Same;
    uint8_t reg = 0;
    int32_t value = 0;
    int32_t expr = 0;
};

struct Row {
    enum CfaHow : uint8_t { RegisterOffset, CfaExpression };
    CfaHow cfa_how = RegisterOffset;
    uint8_t cfa_reg = kRsp;
    int32_t cfa_offset = 8;  // RegisterOffset: CFA = cfa_reg + cfa_offset
    int32_t cfa_expr = 0;    // CfaExpression: bytes [cfa_expr, cfa_expr + cfa_len) compute the CFA
    int32_t cfa_len = 0;
    bool signal_frame = false;      // the CIE's 'S': the frame below was interrupted, not calling
    const uint8_t* base = nullptr;  // the FDE: expressions are at base + offset (the CIE's lie before it)
    Rule regs[kRegisters];

    const uint8_t* at(int32_t offset) const { return base + offset; }
};

enum : uint8_t {  // DW_EH_PE_*
    kPeAbsptr = 0x00,
    kPeUleb128 = 0x01,
    kPeUdata2 = 0x02,
    kPeUdata4 = 0x03,
    kPeUdata8 = 0x04,
    kPeSleb128 = 0x09,
    kPeSdata2 = 0x0a,
    kPeSdata4 = 0x0b,
    kPeSdata8 = 0x0c,
    kPePcrel = 0x10,
    kPeDatarel = 0x30,
    kPeOmit = 0xff,
};

// Reads within [pos, end); a read past the end or an encoding we do not
// know sets `bad` and yields zeros, so parsers check once at the end.
struct Reader {
    const uint8_t* pos;
    const uint8_t* end;
    bool bad = false;

    uint64_t fail() {
        bad = true;
        return 0;
    }
    bool take(void* out, size_t n) {
        if (bad || static_cast<size_t>(end - pos) < n) {
            bad = true;
            memset(out, 0, n);
            return false;
        }
        memcpy(out, pos, n);
        pos += n;
        return true;
    }
    template <class T>
    T fixed() {
        T v;
        take(&v, sizeof v);
        return v;
    }
    uint64_t uleb() {
        uint64_t v = 0;
        for (unsigned shift = 0;; shift += 7) {
            uint8_t b = fixed<uint8_t>();
            if (bad || shift > 63) return fail();
            v |= uint64_t{b & 0x7fu} << shift;
            if (!(b & 0x80)) return v;
        }
    }
    int64_t sleb() {
        uint64_t v = 0;
        for (unsigned shift = 0;; shift += 7) {
            uint8_t b = fixed<uint8_t>();
            if (bad || shift > 63) return static_cast<int64_t>(fail());
            v |= uint64_t{b & 0x7fu} << shift;
            if (!(b & 0x80)) {
                if (shift + 7 < 64 && (b & 0x40)) v |= ~uint64_t{0} << (shift + 7);
                return static_cast<int64_t>(v);
            }
        }
    }
    // An encoded pointer; `data_base` is what DW_EH_PE_datarel is relative to.
    uint64_t pointer(uint8_t enc, uint64_t data_base = 0) {
        if (enc & 0x80) return fail();  // DW_EH_PE_indirect: only personality pointers, which are skipped
        auto field = reinterpret_cast<uint64_t>(pos);
        uint64_t v = 0;
        switch (enc & 0x0f) {
            case kPeAbsptr: v = fixed<uint64_t>(); break;
            case kPeUleb128: v = uleb(); break;
            case kPeUdata2: v = fixed<uint16_t>(); break;
            case kPeUdata4: v = fixed<uint32_t>(); break;
            case kPeUdata8: v = fixed<uint64_t>(); break;
            case kPeSleb128: v = static_cast<uint64_t>(sleb()); break;
            case kPeSdata2: v = static_cast<uint64_t>(int64_t{fixed<int16_t>()}); break;
            case kPeSdata4: v = static_cast<uint64_t>(int64_t{fixed<int32_t>()}); break;
            case kPeSdata8: v = fixed<uint64_t>(); break;
            default: bad = true;
        }
        switch (enc & 0x70) {
            case 0: break;
            case kPePcrel: v += field; break;
            case kPeDatarel: v += data_base; break;
            default: bad = true;  // textrel, funcrel, aligned: not used on x86-64 Linux
        }
        return v;
    }
};

enum class Lookup : uint8_t {
    Found,    // row holds the rule of the address
    NoFde,    // in no loaded object, or one whose CFI covers no such code
    Corrupt,  // CFI we cannot read (malformed, an encoding x86-64 never uses, offsets over 2 GiB)
};

// The row of the CFI at `pc` (for a return address: the address minus 1,
// the call, which may be the last instruction of its function).
Lookup row_at(uint64_t pc, Row& row);

}  // namespace heapsnap::recorder::cfi
