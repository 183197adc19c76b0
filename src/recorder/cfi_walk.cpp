#include "recorder/cfi_walk.h"

#include <sys/syscall.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "recorder/cfi.h"
#include "recorder/unwind_step.h"

// Every callee-saved register of the caller, its rsp after the return and
// the return address, into regs[DWARF number] (cfi.h): the state of the
// caller right after the call, which its CFI describes at the return
// address minus one.
extern "C" void heapsnap_callee_saved(uint64_t* regs);
asm(R"(
    .text
    .globl heapsnap_callee_saved
    .hidden heapsnap_callee_saved
    .type heapsnap_callee_saved, @function
    .p2align 4
heapsnap_callee_saved:
    .cfi_startproc
    mov %rbx, 3*8(%rdi)
    mov %rbp, 6*8(%rdi)
    lea 8(%rsp), %rax
    mov %rax, 7*8(%rdi)
    mov %r12, 12*8(%rdi)
    mov %r13, 13*8(%rdi)
    mov %r14, 14*8(%rdi)
    mov %r15, 15*8(%rdi)
    mov (%rsp), %rax
    mov %rax, 16*8(%rdi)
    ret
    .cfi_endproc
    .size heapsnap_callee_saved, .-heapsnap_callee_saved
)");

namespace heapsnap::recorder {
namespace {

using cfi::kRbp;
using cfi::kRegisters;
using cfi::kRip;
using cfi::kRsp;

struct Registers {
    uint64_t value[kRegisters];
    uint32_t known;  // bit n: value[n] is the frame's

    bool has(unsigned reg) const { return (known >> reg) & 1; }
    void set(unsigned reg, uint64_t v) {
        value[reg] = v;
        known |= 1u << reg;
    }
};

constexpr uint32_t kCalleeSaved =
    1u << 3 | 1u << kRbp | 1u << kRsp | 1u << 12 | 1u << 13 | 1u << 14 | 1u << 15 | 1u << kRip;

// Reads of the walk. Below the first frame, on the thread's own stack,
// nothing can fault (readable); anywhere else each word is checked first.
struct Memory {
    uint64_t first_sp;

    bool read(uint64_t addr, void* out, unsigned n) const {
        if (addr < 4096 || addr > UINT64_MAX - 8) return false;
        if (!unwinder::readable(first_sp, addr, addr + n)) {
            if (!word_readable(addr)) return false;
            if (((addr + n - 1) & ~uint64_t{7}) != (addr & ~uint64_t{7}) && !word_readable(addr + n - 1)) return false;
        }
        memcpy(out, reinterpret_cast<const void*>(addr), n);
        return true;
    }
    bool word(uint64_t addr, uint64_t* out) const { return read(addr, out, 8); }
};

// A DWARF expression (DWARF 5 section 2.5) of a CFI rule, with `initial`
// pushed first if given. The operations a location expression of CFI may
// use; anything else (and a register we do not know) fails the step.
bool evaluate(const uint8_t* code, int32_t len, const Registers& regs, const Memory& mem, const uint64_t* initial,
              uint64_t* result) {
    constexpr int kDepth = 16;
    uint64_t stack[kDepth];
    int sp = 0;
    if (initial) stack[sp++] = *initial;
    cfi::Reader r{code, code + len};
    auto push = [&](uint64_t v) {
        if (sp == kDepth) return false;
        stack[sp++] = v;
        return true;
    };
    for (int executed = 0; r.pos < r.end && !r.bad; ++executed) {
        if (executed == 256) return false;  // a branch looping
        uint8_t op = r.fixed<uint8_t>();
        bool ok = true;
        if (op >= 0x30 && op <= 0x4f) {  // DW_OP_lit0..31
            ok = push(op - 0x30u);
        } else if ((op >= 0x70 && op <= 0x8f) || op == 0x92) {  // DW_OP_breg0..31, DW_OP_bregx
            uint64_t reg = op == 0x92 ? r.uleb() : op - 0x70u;
            int64_t offset = r.sleb();
            ok = reg < kRegisters && regs.has(static_cast<unsigned>(reg)) &&
                 push(regs.value[reg] + static_cast<uint64_t>(offset));
        } else {
            // The unary and binary operations need their operands.
            auto pop = [&](uint64_t* v) {
                if (sp == 0) return false;
                *v = stack[--sp];
                return true;
            };
            uint64_t a = 0, b = 0;
            switch (op) {
                case 0x03: ok = push(r.fixed<uint64_t>()); break;  // DW_OP_addr
                case 0x06: ok = pop(&a) && mem.word(a, &b) && push(b); break;
                case 0x08: ok = push(r.fixed<uint8_t>()); break;
                case 0x09: ok = push(static_cast<uint64_t>(int64_t{r.fixed<int8_t>()})); break;
                case 0x0a: ok = push(r.fixed<uint16_t>()); break;
                case 0x0b: ok = push(static_cast<uint64_t>(int64_t{r.fixed<int16_t>()})); break;
                case 0x0c: ok = push(r.fixed<uint32_t>()); break;
                case 0x0d: ok = push(static_cast<uint64_t>(int64_t{r.fixed<int32_t>()})); break;
                case 0x0e:
                case 0x0f: ok = push(r.fixed<uint64_t>()); break;
                case 0x10: ok = push(r.uleb()); break;
                case 0x11: ok = push(static_cast<uint64_t>(r.sleb())); break;
                case 0x12: ok = sp > 0 && push(stack[sp - 1]); break;  // DW_OP_dup
                case 0x13: ok = pop(&a); break;                        // DW_OP_drop
                case 0x14: ok = sp > 1 && push(stack[sp - 2]); break;  // DW_OP_over
                case 0x15: {                                           // DW_OP_pick
                    uint8_t i = r.fixed<uint8_t>();
                    ok = i < sp && push(stack[sp - 1 - i]);
                    break;
                }
                case 0x16:  // DW_OP_swap
                    ok = sp > 1;
                    if (ok) std::swap(stack[sp - 1], stack[sp - 2]);
                    break;
                case 0x17:  // DW_OP_rot: the top three, the top moved to third
                    ok = sp > 2;
                    if (ok) {
                        uint64_t top = stack[sp - 1];
                        stack[sp - 1] = stack[sp - 2];
                        stack[sp - 2] = stack[sp - 3];
                        stack[sp - 3] = top;
                    }
                    break;
                case 0x19:  // DW_OP_abs
                    ok = pop(&a) && push(static_cast<int64_t>(a) < 0 ? -a : a);
                    break;
                case 0x1f: ok = pop(&a) && push(-a); break;            // DW_OP_neg
                case 0x20: ok = pop(&a) && push(~a); break;            // DW_OP_not
                case 0x23: ok = pop(&a) && push(a + r.uleb()); break;  // DW_OP_plus_uconst
                case 0x94: {                                           // DW_OP_deref_size
                    uint8_t size = r.fixed<uint8_t>();
                    uint64_t v = 0;
                    ok = size >= 1 && size <= 8 && pop(&a) && mem.read(a, &v, size) && push(v);
                    break;
                }
                case 0x96: break;  // DW_OP_nop
                case 0x2f: {       // DW_OP_skip
                    int16_t to = r.fixed<int16_t>();
                    if (to < code - r.pos || to > r.end - r.pos) return false;
                    r.pos += to;
                    break;
                }
                case 0x28: {  // DW_OP_bra
                    int16_t to = r.fixed<int16_t>();
                    ok = pop(&a);
                    if (ok && a) {
                        if (to < code - r.pos || to > r.end - r.pos) return false;
                        r.pos += to;
                    }
                    break;
                }
                default: {  // the binary operations: b op a, a on top
                    ok = pop(&a) && pop(&b);
                    if (!ok) break;
                    const auto sa = static_cast<int64_t>(a), sb = static_cast<int64_t>(b);
                    uint64_t v;
                    switch (op) {
                        case 0x1a: v = b & a; break;
                        case 0x1b:  // DW_OP_div (signed)
                            if (a == 0 || (sb == INT64_MIN && sa == -1)) return false;
                            v = static_cast<uint64_t>(sb / sa);
                            break;
                        case 0x1c: v = b - a; break;
                        case 0x1d:  // DW_OP_mod
                            if (a == 0) return false;
                            v = b % a;
                            break;
                        case 0x1e: v = b * a; break;
                        case 0x21: v = b | a; break;
                        case 0x22: v = b + a; break;
                        case 0x24: v = a >= 64 ? 0 : b << a; break;
                        case 0x25: v = a >= 64 ? 0 : b >> a; break;
                        case 0x26: v = static_cast<uint64_t>(a >= 64 ? (sb < 0 ? -1 : 0) : sb >> a); break;
                        case 0x27: v = b ^ a; break;
                        case 0x29: v = sb == sa; break;
                        case 0x2a: v = sb >= sa; break;
                        case 0x2b: v = sb > sa; break;
                        case 0x2c: v = sb <= sa; break;
                        case 0x2d: v = sb < sa; break;
                        case 0x2e: v = sb != sa; break;
                        default: return false;  // DW_OP_reg*, pieces, calls, TLS: not in CFI we follow
                    }
                    ok = push(v);
                }
            }
        }
        if (!ok) return false;
    }
    if (r.bad || sp == 0) return false;
    *result = stack[sp - 1];
    return true;
}

// The caller's value of `reg` by its rule; false where it is not known.
bool apply(const cfi::Row& row, const cfi::Rule& rule, unsigned reg, uint64_t cfa, const Registers& callee,
           const Memory& mem, uint64_t* out) {
    switch (rule.how) {
        case cfi::Rule::Same: *out = callee.value[reg]; return callee.has(reg);
        case cfi::Rule::Undefined: return false;
        case cfi::Rule::Offset: return mem.word(cfa + static_cast<int64_t>(rule.value), out);
        case cfi::Rule::ValOffset: *out = cfa + static_cast<int64_t>(rule.value); return true;
        case cfi::Rule::Register: *out = callee.value[rule.reg]; return callee.has(rule.reg);
        case cfi::Rule::Expression: {
            uint64_t at;
            return evaluate(row.at(rule.expr), rule.value, callee, mem, &cfa, &at) && mem.word(at, out);
        }
        case cfi::Rule::ValExpression: return evaluate(row.at(rule.expr), rule.value, callee, mem, &cfa, out);
    }
    return false;
}

// ByCfi: libunwind ends the stack where the caller's ip is 0.
// WithoutCfi (step_without_cfi): libunwind reports the caller's ip
// whatever it is, and goes on from there unless the step went nowhere.
enum class Step { ByCfi, WithoutCfi, End };

// One frame out by its CFI. The caller's rsp is the CFA.
Step step_by_row(const cfi::Row& row, Registers& regs, const Memory& mem) {
    uint64_t cfa;
    if (row.cfa_how == cfi::Row::RegisterOffset) {
        if (!regs.has(row.cfa_reg)) return Step::End;
        cfa = regs.value[row.cfa_reg] + static_cast<int64_t>(row.cfa_offset);
    } else if (!evaluate(row.at(row.cfa_expr), row.cfa_len, regs, mem, nullptr, &cfa)) {
        return Step::End;
    }
    // An undefined rip or rbp marks the outermost frame (frame_rules.h).
    if (row.regs[kRip].how == cfi::Rule::Undefined || row.regs[kRbp].how == cfi::Rule::Undefined) return Step::End;
    Registers caller{{}, 0};
    for (unsigned reg = 0; reg < kRegisters; ++reg) {
        if (reg == kRsp) continue;
        // A value that cannot be had (undefined, unknown in the callee, a
        // saved slot that cannot be read) is unknown in the caller; only
        // a step that needs it later ends there, as libunwind, which reads
        // a saved register only when it is asked for, ends there.
        uint64_t v;
        if (apply(row, row.regs[reg], reg, cfa, regs, mem, &v))
            caller.set(reg, v);
        else if (reg == kRip)
            return Step::End;
    }
    caller.set(kRsp, cfa);
    regs = caller;
    return Step::ByCfi;
}

// A return address that no FDE covers (frame_rules.cpp, no_info_rule, says
// what libunwind does there): a signal trampoline without CFI, a PLT
// entry, or a frame stepped by its frame pointer if rbp lies just above
// sp, the stack's end otherwise. `exact` becomes whether the caller's ip
// is where it was interrupted (not a return address).
Step step_without_cfi(Registers& regs, const Memory& mem, bool* exact) {
    const uint64_t ip = regs.value[kRip], sp = regs.value[kRsp];
    // Code that cannot be read (ip is data: the caller of a frame whose
    // CFI was wrong where it was interrupted) is neither, and is guessed
    // by its frame pointer as libunwind guesses it.
    uint64_t code[2];
    if (!mem.word(ip, &code[0]) || !mem.word(ip + 8, &code[1])) code[0] = code[1] = 0;
    if (code[0] == 0x0f0000000fc0c748ull && (code[1] & 0xff) == 0x05) {
        // mov $15, %rax; syscall: rt_sigreturn. The frame's sp is the
        // kernel's rt_sigframe past its return address: the ucontext,
        // whose mcontext (at 40) holds r8-r15, rdi, rsi, rbp, rbx, rdx,
        // rax, rcx, rsp, rip in turn.
        static constexpr uint8_t kDwarfOf[17] = {8, 9, 10, 11, 12, 13, 14, 15, 5, 4, 6, 3, 1, 0, 2, kRsp, kRip};
        Registers interrupted{{}, 0};
        for (unsigned i = 0; i < 17; ++i) {
            uint64_t v;
            if (!mem.word(sp + 40 + 8 * i, &v)) return Step::End;
            interrupted.set(kDwarfOf[i], v);
        }
        regs = interrupted;
        *exact = true;
        return Step::WithoutCfi;
    }
    *exact = false;
    const bool plt =
        (code[0] & 0xffff) == 0x25ff && ((code[0] >> 48) & 0xff) == 0x68 && ((code[1] >> 24) & 0xff) == 0xe9;
    if (plt) {  // jmp *x(%rip); push; jmp: the return address is on top
        uint64_t ra;
        if (!mem.word(sp, &ra)) return Step::End;
        regs.set(kRip, ra);
        regs.set(kRsp, sp + 8);
        return Step::WithoutCfi;
    }
    const uint64_t bp = regs.value[kRbp];
    if (!regs.has(kRbp) || bp == 0 || bp < sp || bp - sp > 0x4000) return Step::End;
    uint64_t saved_bp, ra;
    if (!mem.word(bp, &saved_bp) || !mem.word(bp + 8, &ra)) return Step::End;
    // Every other register is unknown in the caller, as libunwind has it.
    regs.known = 0;
    regs.set(kRip, ra);
    regs.set(kRbp, saved_bp);
    regs.set(kRsp, bp + 16);
    return Step::WithoutCfi;
}

}  // namespace

bool word_readable(uint64_t addr) {
    long ret;
    register long size asm("r10") = 8;
    asm volatile("syscall"
                 : "=a"(ret)
                 : "0"(SYS_rt_sigprocmask), "D"(-1L), "S"(addr & ~uint64_t{7}), "d"(0L), "r"(size)
                 : "rcx", "r11", "memory");
    return ret != -EFAULT;
}

__attribute__((noinline)) int cfi_walk_stack(uint64_t* ips, int max, uint64_t own_start, uint64_t own_end) {
    Registers regs{{}, kCalleeSaved};
    heapsnap_callee_saved(regs.value);
    const Memory mem{regs.value[kRsp]};
    bool exact = false;  // the frame's ip was interrupted there: its CFI is that of ip, not ip - 1
    int count = 0;
    for (int walked = 0; walked < max; ++walked) {
        const uint64_t ip = regs.value[kRip], sp = regs.value[kRsp];
        if (ip < own_start || ip >= own_end) ips[count++] = ip;
        cfi::Row row;
        Step step = Step::End;
        bool next_exact = false;
        switch (ip ? cfi::row_at(exact ? ip : ip - 1, row) : cfi::Lookup::NoFde) {
            case cfi::Lookup::Found:
                step = step_by_row(row, regs, mem);
                next_exact = row.signal_frame;
                break;
            case cfi::Lookup::NoFde: step = step_without_cfi(regs, mem, &next_exact); break;
            case cfi::Lookup::Corrupt: break;
        }
        if (step == Step::End || !regs.has(kRip)) break;
        if (step == Step::ByCfi && regs.value[kRip] == 0) break;
        if (step == Step::WithoutCfi && regs.value[kRip] == ip && regs.value[kRsp] == sp) break;
        exact = next_exact;
    }
    return count;
}

}  // namespace heapsnap::recorder
