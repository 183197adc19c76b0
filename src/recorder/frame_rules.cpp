#include "recorder/frame_rules.h"

#include <dlfcn.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "recorder/cfi.h"
#include "recorder/raw_alloc.h"

namespace heapsnap::recorder {
namespace {

// ---- reducing a row (the miss path) -----------------------------------------------

using cfi::kRbp;
using cfi::kRip;
using cfi::kRsp;

// Recognises the expressions compilers emit for the three registers we
// follow: "breg(rsp|rbp) n" and, for the CFA only, "breg(rsp|rbp) n; deref".
bool parse_expression(const uint8_t* p, uint64_t len, FrameRule::Base* base, int64_t* offset, bool* deref) {
    cfi::Reader r{p, p + len};
    uint8_t op = r.fixed<uint8_t>();
    if (op != 0x70 + kRsp && op != 0x70 + kRbp) return false;  // DW_OP_breg7 / DW_OP_breg6
    *base = op == 0x70 + kRsp ? FrameRule::Rsp : FrameRule::Rbp;
    *offset = r.sleb();
    *deref = false;
    if (r.pos < r.end && r.fixed<uint8_t>() == 0x06) *deref = true;  // DW_OP_deref
    return !r.bad && r.pos == r.end;
}

bool fits_int32(int64_t v) { return v >= INT32_MIN && v <= INT32_MAX; }

// constexpr: frame_rule() may run before the library's constructors.
constexpr FrameRule kUnsupported{
    FrameRule::Unsupported, FrameRule::Rsp, false, FrameRule::Cfa, FrameRule::Same, 0, 0, 0};

// A register's rule in the reduced form: saved at base + offset (Cfa,
// Rsp, Rbp), or unchanged (Same). False for anything else.
bool reduce_rule(const cfi::Row& row, const cfi::Rule& rule, FrameRule::Base* base, int32_t* offset) {
    switch (rule.how) {
        case cfi::Rule::Same:
            *base = FrameRule::Same;
            *offset = 0;
            return true;
        case cfi::Rule::Offset:
            *base = FrameRule::Cfa;
            *offset = rule.value;
            return true;
        case cfi::Rule::Expression: {
            int64_t at;
            bool deref;
            if (!parse_expression(row.at(rule.expr), static_cast<uint64_t>(rule.value), base, &at, &deref) || deref ||
                !fits_int32(at))
                return false;
            *offset = static_cast<int32_t>(at);
            return true;
        }
        default: return false;
    }
}

FrameRule reduce(const cfi::Row& row) {
    FrameRule rule = kUnsupported;
    const cfi::Rule& ra = row.regs[kRip];
    const cfi::Rule& rbp = row.regs[kRbp];
    if (ra.how == cfi::Rule::Undefined || rbp.how == cfi::Rule::Undefined) {
        rule.kind = FrameRule::Outermost;
        return rule;
    }
    FrameRule::Base cfa_base;
    int64_t cfa_offset = row.cfa_offset;
    bool cfa_deref = false;
    if (row.cfa_how == cfi::Row::RegisterOffset) {
        if (row.cfa_reg != kRsp && row.cfa_reg != kRbp) return rule;
        cfa_base = row.cfa_reg == kRsp ? FrameRule::Rsp : FrameRule::Rbp;
    } else if (!parse_expression(row.at(row.cfa_expr), static_cast<uint64_t>(row.cfa_len), &cfa_base, &cfa_offset,
                                 &cfa_deref) ||
               !fits_int32(cfa_offset)) {
        return rule;
    }
    FrameRule::Base ra_base, rbp_base;
    int32_t ra_offset, rbp_offset;
    if (!reduce_rule(row, ra, &ra_base, &ra_offset) || ra_base == FrameRule::Same) return rule;
    if (!reduce_rule(row, rbp, &rbp_base, &rbp_offset)) return rule;
    rule.kind = FrameRule::Step;
    rule.cfa_base = cfa_base;
    rule.cfa_deref = cfa_deref;
    rule.cfa_offset = static_cast<int32_t>(cfa_offset);
    rule.ra_base = ra_base;
    rule.ra_offset = ra_offset;
    rule.rbp_base = rbp_base;
    rule.rbp_offset = rbp_offset;
    return rule;
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
// leaves the guess to the full CFI walk elsewhere (cfi_walk.h). So NoInfo:
// the walk decides per frame.
// The code is read here, once per address: the 16 bytes at the return
// address, through process_vm_readv on this process, which fails where a
// plain read would fault (an address from a corrupt stack can fall in a
// hole of the object's mapping, as libunwind's validated reads allow for).
// If it fails (unreadable, or the syscall refused by a seccomp filter),
// the stack goes to the full CFI walk.
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
    cfi::Row row;
    switch (cfi::row_at(pc, row)) {
        case cfi::Lookup::NoFde: return no_info_rule(pc);
        case cfi::Lookup::Corrupt: return kUnsupported;
        case cfi::Lookup::Found: break;
    }
    if (row.signal_frame) return kUnsupported;  // see frame_rules.h
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
    return &kUnsupported;  // a crowded neighbourhood: that stack goes to the full CFI walk
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
