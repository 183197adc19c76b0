#include "recorder/cfi.h"

#include <dlfcn.h>

#include <cstddef>
#include <cstring>

namespace heapsnap::recorder::cfi {
namespace {

struct Cie {
    uint64_t code_align = 1;
    int64_t data_align = -8;
    uint8_t fde_encoding = kPeAbsptr;
    bool signal_frame = false;
    bool has_z = false;
    Reader instructions{nullptr, nullptr};
};

bool read_length(Reader& r, const uint8_t** end) {
    uint64_t length = r.fixed<uint32_t>();
    if (length == 0xffffffffu) length = r.fixed<uint64_t>();
    if (r.bad || length == 0 || length > static_cast<uint64_t>(PTRDIFF_MAX)) return false;
    *end = r.pos + length;
    return true;
}

bool parse_cie(const uint8_t* at, Cie& cie) {
    Reader r{at, at + 16};
    const uint8_t* end = nullptr;
    if (!read_length(r, &end)) return false;
    r.end = end;
    if (r.fixed<uint32_t>() != 0) return false;  // not a CIE
    uint8_t version = r.fixed<uint8_t>();
    if (version != 1 && version != 3) return false;
    const char* augmentation = reinterpret_cast<const char*>(r.pos);
    size_t aug_len = strnlen(augmentation, static_cast<size_t>(r.end - r.pos));
    if (aug_len == static_cast<size_t>(r.end - r.pos)) return false;
    r.pos += aug_len + 1;
    cie.code_align = r.uleb();
    cie.data_align = r.sleb();
    uint64_t ra_column = version == 1 ? r.fixed<uint8_t>() : r.uleb();
    if (ra_column != kRip) return false;
    if (aug_len && augmentation[0] != 'z') return false;  // "eh" and friends: pre-z, never on x86-64
    if (aug_len) {
        cie.has_z = true;
        uint64_t data_len = r.uleb();
        const uint8_t* data_end = r.pos + data_len;
        for (size_t i = 1; i < aug_len && !r.bad; ++i) {
            switch (augmentation[i]) {
                case 'R': cie.fde_encoding = r.fixed<uint8_t>(); break;
                case 'P': r.pointer(r.fixed<uint8_t>() & 0x7f); break;  // personality: skipped, not followed
                case 'L': r.fixed<uint8_t>(); break;
                case 'S': cie.signal_frame = true; break;
                case 'B':
                case 'G': break;  // no data
                default: return false;
            }
        }
        if (r.bad || data_end > r.end) return false;
        r.pos = data_end;
    }
    cie.instructions = r;
    return !r.bad;
}

// The FDE covering pc, through the binary-search table of .eh_frame_hdr.
const uint8_t* find_fde(const uint8_t* hdr, uint64_t pc) {
    Reader r{hdr, hdr + 4};
    uint8_t version = r.fixed<uint8_t>();
    uint8_t eh_frame_ptr_enc = r.fixed<uint8_t>();
    uint8_t count_enc = r.fixed<uint8_t>();
    uint8_t table_enc = r.fixed<uint8_t>();
    if (version != 1 || table_enc != (kPeDatarel | kPeSdata4) || count_enc == kPeOmit) return nullptr;
    r.end = hdr + 4 + 2 * 8;
    auto base = reinterpret_cast<uint64_t>(hdr);
    r.pointer(eh_frame_ptr_enc, base);
    uint64_t count = r.pointer(count_enc, base);
    if (r.bad || count == 0) return nullptr;
    struct Entry {
        int32_t start;
        int32_t fde;
    };
    const uint8_t* table = r.pos;
    auto entry = [&](uint64_t i) {
        Entry e;
        memcpy(&e, table + i * sizeof(Entry), sizeof e);
        return e;
    };
    auto rel = static_cast<int64_t>(pc - base);
    if (rel < entry(0).start) return nullptr;
    uint64_t lo = 0, hi = count;  // invariant: entry(lo).start <= rel < entry(hi).start
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (entry(mid).start <= rel)
            lo = mid;
        else
            hi = mid;
    }
    return hdr + entry(lo).fde;
}

bool fits_int32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

// Nested DW_CFA_remember_state: GCC emits one level, rarely two.
constexpr int kMaxRememberedStates = 8;

// Runs CFA instructions until the row covering `pc` (a row applies from its
// location on). `initial` is the row after the CIE's instructions, for
// DW_CFA_restore. Returns false on CFI we cannot follow: malformed, or a
// number that does not fit the row (a register above 16 is one we never
// read, and its rules are skipped).
bool run_cfa_program(Reader r, const Cie& cie, uint64_t loc, uint64_t pc, const Row& initial, Row& row) {
    Row remembered[kMaxRememberedStates];
    int depth = 0;
    bool fits = true;
    auto rule_of = [&](uint64_t reg) -> Rule* { return reg < kRegisters ? &row.regs[reg] : nullptr; };
    auto set = [&](uint64_t reg, Rule::How how, int64_t value) {
        fits = fits && fits_int32(value);
        if (Rule* rule = rule_of(reg)) *rule = Rule{how, 0, static_cast<int32_t>(value), 0};
    };
    // An expression block at r.pos: skipped, and its place returned.
    auto block = [&](int32_t* at, int32_t* len) {
        uint64_t n = r.uleb();
        if (r.bad || n > static_cast<uint64_t>(r.end - r.pos)) return false;
        int64_t offset = r.pos - row.base;
        fits = fits && fits_int32(offset) && fits_int32(static_cast<int64_t>(n));
        *at = static_cast<int32_t>(offset);
        *len = static_cast<int32_t>(n);
        r.pos += n;
        return true;
    };
    auto advance = [&](uint64_t delta) {
        loc += delta * cie.code_align;
        return loc <= pc;
    };
    while (r.pos < r.end && !r.bad && fits) {
        uint8_t op = r.fixed<uint8_t>();
        uint8_t low = op & 0x3f;
        switch (op >> 6) {
            case 1:  // DW_CFA_advance_loc
                if (!advance(low)) return fits;
                continue;
            case 2:  // DW_CFA_offset
                set(low, Rule::Offset, static_cast<int64_t>(r.uleb()) * cie.data_align);
                continue;
            case 3:  // DW_CFA_restore
                if (Rule* rule = rule_of(low)) *rule = initial.regs[low];
                continue;
        }
        switch (op) {
            case 0x00: break;  // DW_CFA_nop
            case 0x01:         // DW_CFA_set_loc
                loc = r.pointer(cie.fde_encoding);
                if (loc > pc) return !r.bad && fits;
                break;
            case 0x02:
                if (!advance(r.fixed<uint8_t>())) return !r.bad && fits;
                break;
            case 0x03:
                if (!advance(r.fixed<uint16_t>())) return !r.bad && fits;
                break;
            case 0x04:
                if (!advance(r.fixed<uint32_t>())) return !r.bad && fits;
                break;
            case 0x05: {  // DW_CFA_offset_extended
                uint64_t reg = r.uleb();
                set(reg, Rule::Offset, static_cast<int64_t>(r.uleb()) * cie.data_align);
                break;
            }
            case 0x06: {  // DW_CFA_restore_extended
                uint64_t reg = r.uleb();
                if (Rule* rule = rule_of(reg)) *rule = initial.regs[reg];
                break;
            }
            case 0x07: set(r.uleb(), Rule::Undefined, 0); break;
            case 0x08: set(r.uleb(), Rule::Same, 0); break;
            case 0x09: {  // DW_CFA_register
                uint64_t reg = r.uleb();
                uint64_t from = r.uleb();
                if (from >= kRegisters) return false;
                if (Rule* rule = rule_of(reg)) *rule = Rule{Rule::Register, static_cast<uint8_t>(from), 0, 0};
                break;
            }
            case 0x0a:  // DW_CFA_remember_state
                if (depth == kMaxRememberedStates) return false;
                remembered[depth++] = row;
                break;
            case 0x0b:  // DW_CFA_restore_state (the CFA is restored too, as GCC expects)
                if (depth == 0) return false;
                row = remembered[--depth];
                break;
            case 0x0c:    // DW_CFA_def_cfa
            case 0x12: {  // DW_CFA_def_cfa_sf
                uint64_t reg = r.uleb();
                int64_t offset = op == 0x0c ? static_cast<int64_t>(r.uleb()) : r.sleb() * cie.data_align;
                if (reg >= kRegisters || !fits_int32(offset)) return false;
                row.cfa_how = Row::RegisterOffset;
                row.cfa_reg = static_cast<uint8_t>(reg);
                row.cfa_offset = static_cast<int32_t>(offset);
                break;
            }
            case 0x0d: {  // DW_CFA_def_cfa_register
                uint64_t reg = r.uleb();
                if (reg >= kRegisters || row.cfa_how != Row::RegisterOffset) return false;
                row.cfa_reg = static_cast<uint8_t>(reg);
                break;
            }
            case 0x0e:    // DW_CFA_def_cfa_offset
            case 0x13: {  // DW_CFA_def_cfa_offset_sf
                int64_t offset = op == 0x0e ? static_cast<int64_t>(r.uleb()) : r.sleb() * cie.data_align;
                if (!fits_int32(offset) || row.cfa_how != Row::RegisterOffset) return false;
                row.cfa_offset = static_cast<int32_t>(offset);
                break;
            }
            case 0x0f:  // DW_CFA_def_cfa_expression
                if (!block(&row.cfa_expr, &row.cfa_len)) return false;
                row.cfa_how = Row::CfaExpression;
                break;
            case 0x10:    // DW_CFA_expression
            case 0x16: {  // DW_CFA_val_expression
                uint64_t reg = r.uleb();
                Rule rule{op == 0x10 ? Rule::Expression : Rule::ValExpression, 0, 0, 0};
                if (!block(&rule.expr, &rule.value)) return false;
                if (Rule* into = rule_of(reg)) *into = rule;
                break;
            }
            case 0x11: {  // DW_CFA_offset_extended_sf
                uint64_t reg = r.uleb();
                set(reg, Rule::Offset, r.sleb() * cie.data_align);
                break;
            }
            case 0x14: {  // DW_CFA_val_offset
                uint64_t reg = r.uleb();
                set(reg, Rule::ValOffset, static_cast<int64_t>(r.uleb()) * cie.data_align);
                break;
            }
            case 0x15: {  // DW_CFA_val_offset_sf
                uint64_t reg = r.uleb();
                set(reg, Rule::ValOffset, r.sleb() * cie.data_align);
                break;
            }
            case 0x2e: r.uleb(); break;  // DW_CFA_GNU_args_size: only for landing pads
            case 0x2f: {                 // DW_CFA_GNU_negative_offset_extended
                uint64_t reg = r.uleb();
                set(reg, Rule::Offset, -static_cast<int64_t>(r.uleb()) * cie.data_align);
                break;
            }
            default: return false;
        }
    }
    return !r.bad && fits;
}

}  // namespace

Lookup row_at(uint64_t pc, Row& row) {
    dl_find_object found;
    if (_dl_find_object(reinterpret_cast<void*>(pc), &found) != 0 || !found.dlfo_eh_frame) return Lookup::NoFde;
    const uint8_t* fde = find_fde(static_cast<const uint8_t*>(found.dlfo_eh_frame), pc);
    if (!fde) return Lookup::NoFde;
    Reader r{fde, fde + 16};
    const uint8_t* end = nullptr;
    if (!read_length(r, &end)) return Lookup::Corrupt;
    r.end = end;
    const uint8_t* id_field = r.pos;
    uint32_t cie_offset = r.fixed<uint32_t>();
    Cie cie;
    if (r.bad || cie_offset == 0 || !parse_cie(id_field - cie_offset, cie)) return Lookup::Corrupt;
    uint64_t pc_begin = r.pointer(cie.fde_encoding);
    uint64_t pc_range = r.pointer(cie.fde_encoding & 0x0f);
    if (cie.has_z) r.pos += r.uleb();
    if (r.bad || r.pos > r.end) return Lookup::Corrupt;
    if (pc < pc_begin || pc - pc_begin >= pc_range) return Lookup::NoFde;
    Row initial;
    initial.base = fde;
    initial.signal_frame = cie.signal_frame;
    if (!run_cfa_program(cie.instructions, cie, pc_begin, pc, initial, initial)) return Lookup::Corrupt;
    row = initial;
    if (!run_cfa_program(r, cie, pc_begin, pc, initial, row)) return Lookup::Corrupt;
    return Lookup::Found;
}

}  // namespace heapsnap::recorder::cfi
