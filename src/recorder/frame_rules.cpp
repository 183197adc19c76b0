#include "recorder/frame_rules.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "recorder/raw_alloc.h"

namespace heapsnap::recorder {
namespace {

// ---- reading CFI (the miss path) --------------------------------------------
// Formats: the System V x86-64 ABI (.eh_frame_hdr, .eh_frame) and DWARF 5
// section 6.4 (call frame instructions).

constexpr uint64_t kRbp = 6, kRsp = 7, kRip = 16;  // DWARF register numbers

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

// The rule of one register while the CFA program runs.
struct RegRule {
    enum How : uint8_t { Same, Undefined, At, Unsupported };
    How how = Same;
    FrameRule::Base base = FrameRule::Cfa;  // for At: the address is base + offset
    int64_t offset = 0;
};

struct Row {
    enum CfaHow : uint8_t { Register, Deref, Bad };
    CfaHow cfa = Register;
    uint64_t cfa_reg = kRsp;
    int64_t cfa_offset = 8;
    RegRule rbp;
    RegRule ra;
};

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

// Recognises the expressions compilers emit for the three registers we
// follow: "breg(rsp|rbp) n" and, for the CFA only, "breg(rsp|rbp) n; deref".
bool parse_expression(const uint8_t* p, uint64_t len, FrameRule::Base* base, int64_t* offset, bool* deref) {
    Reader r{p, p + len};
    uint8_t op = r.fixed<uint8_t>();
    if (op != 0x70 + kRsp && op != 0x70 + kRbp) return false;  // DW_OP_breg7 / DW_OP_breg6
    *base = op == 0x70 + kRsp ? FrameRule::Rsp : FrameRule::Rbp;
    *offset = r.sleb();
    *deref = false;
    if (r.pos < r.end && r.fixed<uint8_t>() == 0x06) *deref = true;  // DW_OP_deref
    return !r.bad && r.pos == r.end;
}

constexpr int kMaxRememberedStates = 16;

// Runs CFA instructions until the row covering `pc` (a row applies from its
// location on). `initial` is the row after the CIE's instructions, for
// DW_CFA_restore. Returns false on malformed CFI.
bool run_cfa_program(Reader r, const Cie& cie, uint64_t loc, uint64_t pc, const Row& initial, Row& row) {
    Row remembered[kMaxRememberedStates];
    int depth = 0;
    auto rule_of = [&](uint64_t reg) -> RegRule* {
        if (reg == kRbp) return &row.rbp;
        if (reg == kRip) return &row.ra;
        return nullptr;  // registers a walk never reads
    };
    auto set_at_cfa = [&](uint64_t reg, int64_t offset) {
        if (RegRule* rule = rule_of(reg)) *rule = RegRule{RegRule::At, FrameRule::Cfa, offset};
    };
    auto set = [&](uint64_t reg, RegRule::How how) {
        if (RegRule* rule = rule_of(reg)) *rule = RegRule{how, FrameRule::Cfa, 0};
    };
    auto advance = [&](uint64_t delta) {
        loc += delta * cie.code_align;
        return loc <= pc;
    };
    while (r.pos < r.end && !r.bad) {
        uint8_t op = r.fixed<uint8_t>();
        uint8_t low = op & 0x3f;
        switch (op >> 6) {
            case 1:  // DW_CFA_advance_loc
                if (!advance(low)) return true;
                continue;
            case 2:  // DW_CFA_offset
                set_at_cfa(low, static_cast<int64_t>(r.uleb()) * cie.data_align);
                continue;
            case 3:  // DW_CFA_restore
                if (RegRule* rule = rule_of(low)) *rule = low == kRbp ? initial.rbp : initial.ra;
                continue;
        }
        switch (op) {
            case 0x00: break;  // DW_CFA_nop
            case 0x01:         // DW_CFA_set_loc
                loc = r.pointer(cie.fde_encoding);
                if (loc > pc) return !r.bad;
                break;
            case 0x02:
                if (!advance(r.fixed<uint8_t>())) return !r.bad;
                break;
            case 0x03:
                if (!advance(r.fixed<uint16_t>())) return !r.bad;
                break;
            case 0x04:
                if (!advance(r.fixed<uint32_t>())) return !r.bad;
                break;
            case 0x05: {  // DW_CFA_offset_extended
                uint64_t reg = r.uleb();
                set_at_cfa(reg, static_cast<int64_t>(r.uleb()) * cie.data_align);
                break;
            }
            case 0x06: {  // DW_CFA_restore_extended
                uint64_t reg = r.uleb();
                if (RegRule* rule = rule_of(reg)) *rule = reg == kRbp ? initial.rbp : initial.ra;
                break;
            }
            case 0x07: set(r.uleb(), RegRule::Undefined); break;
            case 0x08: set(r.uleb(), RegRule::Same); break;
            case 0x09: {  // DW_CFA_register: a value kept in another register
                uint64_t reg = r.uleb();
                r.uleb();
                set(reg, RegRule::Unsupported);
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
            case 0x0c:  // DW_CFA_def_cfa
                row.cfa = Row::Register;
                row.cfa_reg = r.uleb();
                row.cfa_offset = static_cast<int64_t>(r.uleb());
                break;
            case 0x0d:  // DW_CFA_def_cfa_register
                row.cfa_reg = r.uleb();
                if (row.cfa != Row::Register) row.cfa = Row::Bad;
                break;
            case 0x0e:  // DW_CFA_def_cfa_offset
                row.cfa_offset = static_cast<int64_t>(r.uleb());
                if (row.cfa != Row::Register) row.cfa = Row::Bad;
                break;
            case 0x0f: {  // DW_CFA_def_cfa_expression
                uint64_t len = r.uleb();
                const uint8_t* block = r.pos;
                if (len > static_cast<uint64_t>(r.end - r.pos)) return false;
                r.pos += len;
                FrameRule::Base base;
                bool deref;
                row.cfa = Row::Bad;
                if (parse_expression(block, len, &base, &row.cfa_offset, &deref)) {
                    row.cfa = deref ? Row::Deref : Row::Register;
                    row.cfa_reg = base == FrameRule::Rsp ? kRsp : kRbp;
                }
                break;
            }
            case 0x10: {  // DW_CFA_expression: the register is saved at the address computed
                uint64_t reg = r.uleb();
                uint64_t len = r.uleb();
                const uint8_t* block = r.pos;
                if (len > static_cast<uint64_t>(r.end - r.pos)) return false;
                r.pos += len;
                RegRule* rule = rule_of(reg);
                if (!rule) break;
                FrameRule::Base base;
                int64_t offset;
                bool deref;
                if (parse_expression(block, len, &base, &offset, &deref) && !deref)
                    *rule = RegRule{RegRule::At, base, offset};
                else
                    *rule = RegRule{RegRule::Unsupported, FrameRule::Cfa, 0};
                break;
            }
            case 0x11: {  // DW_CFA_offset_extended_sf
                uint64_t reg = r.uleb();
                set_at_cfa(reg, r.sleb() * cie.data_align);
                break;
            }
            case 0x12:  // DW_CFA_def_cfa_sf
                row.cfa = Row::Register;
                row.cfa_reg = r.uleb();
                row.cfa_offset = r.sleb() * cie.data_align;
                break;
            case 0x13:  // DW_CFA_def_cfa_offset_sf
                row.cfa_offset = r.sleb() * cie.data_align;
                if (row.cfa != Row::Register) row.cfa = Row::Bad;
                break;
            case 0x14:    // DW_CFA_val_offset
            case 0x15: {  // DW_CFA_val_offset_sf
                uint64_t reg = r.uleb();
                if (op == 0x14)
                    r.uleb();
                else
                    r.sleb();
                set(reg, RegRule::Unsupported);
                break;
            }
            case 0x16: {  // DW_CFA_val_expression
                uint64_t reg = r.uleb();
                uint64_t len = r.uleb();
                if (len > static_cast<uint64_t>(r.end - r.pos)) return false;
                r.pos += len;
                set(reg, RegRule::Unsupported);
                break;
            }
            case 0x2e: r.uleb(); break;  // DW_CFA_GNU_args_size: only for landing pads
            case 0x2f: {                 // DW_CFA_GNU_negative_offset_extended
                uint64_t reg = r.uleb();
                set_at_cfa(reg, -static_cast<int64_t>(r.uleb()) * cie.data_align);
                break;
            }
            default: return false;
        }
    }
    return !r.bad;
}

bool fits_int32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

// constexpr: frame_rule() may run before the library's constructors.
constexpr FrameRule kUnsupported{
    FrameRule::Unsupported, FrameRule::Rsp, false, FrameRule::Cfa, FrameRule::Same, 0, 0, 0};

FrameRule reduce(const Row& row) {
    FrameRule rule = kUnsupported;
    if (row.ra.how == RegRule::Undefined || row.rbp.how == RegRule::Undefined) {
        rule.kind = FrameRule::Outermost;
        return rule;
    }
    if (row.cfa == Row::Bad || (row.cfa_reg != kRsp && row.cfa_reg != kRbp)) return rule;
    if (row.ra.how != RegRule::At || (row.rbp.how != RegRule::At && row.rbp.how != RegRule::Same)) return rule;
    if (!fits_int32(row.cfa_offset) || !fits_int32(row.ra.offset) || !fits_int32(row.rbp.offset)) return rule;
    rule.kind = FrameRule::Step;
    rule.cfa_base = row.cfa_reg == kRsp ? FrameRule::Rsp : FrameRule::Rbp;
    rule.cfa_deref = row.cfa == Row::Deref;
    rule.cfa_offset = static_cast<int32_t>(row.cfa_offset);
    rule.ra_base = row.ra.base;
    rule.ra_offset = static_cast<int32_t>(row.ra.offset);
    rule.rbp_base = row.rbp.how == RegRule::Same ? FrameRule::Same : row.rbp.base;
    rule.rbp_offset = static_cast<int32_t>(row.rbp.offset);
    return rule;
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

// The rule of a return address (pc + 1) that no FDE covers: in a loaded
// object's code without one, or in code of no loaded object (a JIT's).
// libunwind's unw_step, where dwarf_step finds no unwind info, takes the
// code at the return address for a signal trampoline (mov $15, %rax;
// syscall) or a PLT entry (jmp *x(%rip); push; jmp), and otherwise ends
// the stack there if the frame's rbp is 0 (the frame itself is reported):
// the x86-64 ABI's mark of the outermost frame. glibc's _dl_start_user,
// the caller of every shared library's constructors, is such code.
// Anything else it guesses by the frame-pointer chain if rbp lies just
// above the frame's sp, and ends the stack at otherwise; the walk does the
// same where it can prove the reads safe (unwind_step.h, walk_rule) and
// leaves the guess to libunwind elsewhere. So NoInfo: the walk decides per
// frame.
// The code is read here, once per address: the 16 bytes at the return
// address, through process_vm_readv on this process, which fails where a
// plain read would fault (an address from a corrupt stack can fall in a
// hole of the object's mapping, as libunwind's validated reads allow for).
// If it fails (unreadable, or the syscall refused by a seccomp filter),
// the stack goes to libunwind.
FrameRule no_info_rule(uint64_t pc) {
    uint64_t ip = pc + 1;
    uint64_t words[2];
    iovec local{words, sizeof words};
    iovec remote{reinterpret_cast<void*>(ip), sizeof words};
    if (syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0) != static_cast<long>(sizeof words))
        return kUnsupported;
    uint64_t w0 = words[0], w1 = words[1];
    bool sigreturn = w0 == 0x0f0000000fc0c748ull && (w1 & 0xff) == 0x05;
    bool plt = (w0 & 0xffff) == 0x25ff && ((w0 >> 48) & 0xff) == 0x68 && ((w1 >> 24) & 0xff) == 0xe9;
    if (sigreturn || plt) return kUnsupported;
    FrameRule rule = kUnsupported;
    rule.kind = FrameRule::NoInfo;
    return rule;
}

FrameRule read_rule(uint64_t pc) {
    dl_find_object found;
    // Code in no loaded object (a JIT's) has no FDE either: libunwind's
    // lookup fails the same way there.
    if (_dl_find_object(reinterpret_cast<void*>(pc), &found) != 0) return no_info_rule(pc);
    if (!found.dlfo_eh_frame) return kUnsupported;
    const uint8_t* fde = find_fde(static_cast<const uint8_t*>(found.dlfo_eh_frame), pc);
    if (!fde) return no_info_rule(pc);
    Reader r{fde, fde + 16};
    const uint8_t* end = nullptr;
    if (!read_length(r, &end)) return kUnsupported;
    r.end = end;
    const uint8_t* id_field = r.pos;
    uint32_t cie_offset = r.fixed<uint32_t>();
    Cie cie;
    if (r.bad || cie_offset == 0 || !parse_cie(id_field - cie_offset, cie)) return kUnsupported;
    uint64_t pc_begin = r.pointer(cie.fde_encoding);
    uint64_t pc_range = r.pointer(cie.fde_encoding & 0x0f);
    if (cie.has_z) r.pos += r.uleb();
    if (r.bad || r.pos > r.end) return kUnsupported;
    if (pc < pc_begin || pc - pc_begin >= pc_range) return no_info_rule(pc);
    if (cie.signal_frame) return kUnsupported;  // see frame_rules.h
    Row initial;
    initial.ra.how = RegRule::Same;  // until the CIE says where it is
    if (!run_cfa_program(cie.instructions, cie, pc_begin, pc, initial, initial)) return kUnsupported;
    Row row = initial;
    if (!run_cfa_program(r, cie, pc_begin, pc, initial, row)) return kUnsupported;
    return reduce(row);
}

// ---- the cache ------------------------------------------------------------------

struct Slot {
    std::atomic<uint64_t> pc;  // 0: empty; kBusy: being filled
    FrameRule rule;
};

struct Table {
    uint64_t mask;
    unsigned shift;
    std::atomic<uint64_t> used;
    Table* older;  // the table this one replaced: its rules are not read again
    Slot slots[1];
};

constexpr uint64_t kBusy = 1;  // no code at address 1
constexpr unsigned kFirstBits = 12;
constexpr int kMaxProbes = 64;

std::atomic<Table*> g_table{nullptr};

size_t table_bytes(uint64_t capacity) { return sizeof(Table) + (capacity - 1) * sizeof(Slot); }

// Publishes a table of 2^bits slots in place of `old`; returns the current one.
Table* replace_table(Table* old, unsigned bits) {
    uint64_t capacity = uint64_t{1} << bits;
    auto* fresh = static_cast<Table*>(raw_map_populated(table_bytes(capacity)));
    if (!fresh) return old;
    fresh->mask = capacity - 1;
    fresh->shift = 64 - bits;
    fresh->older = old;
    if (g_table.compare_exchange_strong(old, fresh, std::memory_order_acq_rel)) return fresh;
    raw_unmap(fresh, table_bytes(capacity));
    return old;  // another thread's table won; `old` now holds it
}

uint64_t home(const Table* t, uint64_t pc) { return (pc * 0x9e3779b97f4a7c15ull) >> t->shift; }

// The probe of frame_rule: the slot of pc in t, or null.
const Slot* find(const Table* t, uint64_t pc) {
    uint64_t i = home(t, pc);
    for (int probe = 0; probe < kMaxProbes; ++probe, i = (i + 1) & t->mask) {
        const Slot& s = t->slots[i];
        uint64_t key = s.pc.load(std::memory_order_acquire);
        if (key == pc) return &s;
        if (key == 0) break;
    }
    return nullptr;
}

// A rule an older table has, else the CFI's.
FrameRule rule_of(const Table* t, uint64_t pc) {
    for (const Table* old = t->older; old; old = old->older)
        if (const Slot* s = find(old, pc)) return s->rule;
    return read_rule(pc);
}

const FrameRule* insert(Table* t, uint64_t pc) {
    FrameRule rule = rule_of(t, pc);
    if (t->used.load(std::memory_order_relaxed) * 2 >= t->mask + 1)
        t = replace_table(t, static_cast<unsigned>(64 - t->shift) + 2);
    uint64_t i = home(t, pc);
    for (int probe = 0; probe < kMaxProbes; ++probe, i = (i + 1) & t->mask) {
        Slot& s = t->slots[i];
        uint64_t key = s.pc.load(std::memory_order_acquire);
        if (key == pc) return &s.rule;
        if (key != 0) continue;
        if (!s.pc.compare_exchange_strong(key, kBusy, std::memory_order_acquire)) {
            if (key == pc) return &s.rule;
            continue;
        }
        s.rule = rule;
        s.pc.store(pc, std::memory_order_release);
        t->used.fetch_add(1, std::memory_order_relaxed);
        return &s.rule;
    }
    return &kUnsupported;  // a crowded neighbourhood: that stack goes to libunwind
}

}  // namespace

const FrameRule* frame_rule(uint64_t pc) {
    Table* t = g_table.load(std::memory_order_acquire);
    if (__builtin_expect(!t, 0)) {
        t = replace_table(nullptr, kFirstBits);
        if (!t) return &kUnsupported;
    }
    if (const Slot* s = find(t, pc)) return &s->rule;
    return insert(t, pc);
}

}  // namespace heapsnap::recorder
