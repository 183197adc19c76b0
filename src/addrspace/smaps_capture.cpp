#include "addrspace/smaps_capture.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

namespace heapsnap::addrspace {

namespace {

// PATH_MAX plus room for " (deleted)".
constexpr size_t kMaxPathKept = 4096 + 16;

// Longest key name we need to recognise is "Private_Dirty" (13); longer keys
// are remembered as "too long" and match nothing.
constexpr uint32_t kKeyMax = 24;

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool key_is(const char* key, uint32_t len, const char* want) {
    uint32_t i = 0;
    for (; i < len; ++i)
        if (want[i] == '\0' || want[i] != key[i]) return false;
    return want[i] == '\0';
}

// Collects the first token of a line, up to ':' (a key line) or '-' (a region
// header, if everything before it was hex). Shared by both parsers.
struct FirstToken {
    char key[kKeyMax];
    uint32_t len = 0;
    bool too_long = false;
    bool all_hex = true;
    uint32_t hex_digits = 0;
    uint64_t value = 0;

    void reset() {
        len = 0;
        too_long = false;
        all_hex = true;
        hex_digits = 0;
        value = 0;
    }
    void add(char c) {
        if (len < kKeyMax)
            key[len++] = c;
        else
            too_long = true;
        int d = hex_digit(c);
        if (d < 0 || ++hex_digits > 16) {
            all_hex = false;
        } else {
            value = value << 4 | static_cast<uint64_t>(d);
        }
    }
    bool is(const char* want) const { return !too_long && key_is(key, len, want); }
    bool is_address() const { return all_hex && hex_digits > 0; }
};

// "   1234 kB": skip blanks, read the decimal number, ignore the rest.
struct DecimalValue {
    uint64_t* target = nullptr;  // where to store it; nullptr = key not wanted
    uint64_t value = 0;
    bool seen_digit = false;
    bool done = false;

    void start(uint64_t* t) {
        target = t;
        value = 0;
        seen_digit = false;
        done = false;
    }
    void add(char c) {
        if (done) return;
        if (is_digit(c)) {
            value = value * 10 + static_cast<uint64_t>(c - '0');
            seen_digit = true;
        } else if (seen_digit || (c != ' ' && c != '\t')) {
            done = true;
        }
    }
    // True if a number was stored.
    bool commit() {
        if (!target || !seen_digit) return false;
        *target = value;
        return true;
    }
};

class SmapsParser {
public:
    SmapsParser(char* path_buf, size_t path_cap, RegionCallback cb, void* ctx)
        : path_buf_(path_buf), path_cap_(path_cap), cb_(cb), ctx_(ctx) {}

    void feed(const char* p, size_t n) {
        for (size_t i = 0; i < n; ++i) step(p[i]);
    }

    // End of file: a last line without '\n' still counts, and the region in
    // progress is complete.
    long finish() {
        if (state_ != State::LineStart) step('\n');
        deliver();
        return count_;
    }

private:
    enum class State : uint8_t {
        LineStart,
        Token,       // first token of the line, header or key not known yet
        End,         // header: end address
        Perms,       // header: "rw-p"
        Offset,      // header: file offset
        Device,      // header: "fe:01"
        Inode,       // header: inode number
        PathBlanks,  // header: padding before the path
        Path,        // header: the rest of the line
        Value,       // key line: its number
        Skip,        // rest of a line we do not need
    };

    void step(char c) {
        if (c == '\n') {
            end_line();
            return;
        }
        switch (state_) {
            case State::LineStart:
                token_.reset();
                state_ = State::Token;
                [[fallthrough]];
            case State::Token:
                if (c == '-' && token_.is_address()) {
                    begin_region(token_.value);
                } else if (c == ':') {
                    begin_value();
                } else {
                    token_.add(c);
                }
                break;
            case State::End:
                if (c == ' ') {
                    state_ = State::Perms;
                    perm_index_ = 0;
                } else if (!add_hex(&cur_.end, c)) {
                    bad_header();
                }
                break;
            case State::Perms:
                if (c == ' ') {
                    if (perm_index_ == 4)
                        state_ = State::Offset;
                    else
                        bad_header();
                } else if (perm_index_ < 4) {
                    add_perm(c);
                } else {
                    bad_header();
                }
                break;
            case State::Offset:
                if (c == ' ')
                    state_ = State::Device;
                else if (!add_hex(&cur_.offset, c))
                    bad_header();
                break;
            case State::Device:
                if (c == ' ') state_ = State::Inode;
                break;
            case State::Inode:
                if (c == ' ')
                    state_ = State::PathBlanks;
                else if (is_digit(c))
                    cur_.inode = cur_.inode * 10 + static_cast<uint64_t>(c - '0');
                else
                    bad_header();
                break;
            case State::PathBlanks:
                if (c == ' ') break;
                state_ = State::Path;
                [[fallthrough]];
            case State::Path:
                if (path_len_ < path_cap_) path_buf_[path_len_++] = c;
                break;
            case State::Value: value_.add(c); break;
            case State::Skip: break;
        }
    }

    void end_line() {
        switch (state_) {
            case State::Inode:
            case State::PathBlanks:
            case State::Path: header_ok_ = true; break;
            case State::End:
            case State::Perms:
            case State::Offset:
            case State::Device: bad_header(); break;
            case State::Value: value_.commit(); break;
            case State::LineStart:
            case State::Token:
            case State::Skip: break;
        }
        state_ = State::LineStart;
    }

    void begin_region(uint64_t start) {
        deliver();
        cur_ = RawRegion{};
        cur_.start = start;
        path_len_ = 0;
        state_ = State::End;
    }

    void begin_value() {
        uint64_t* target = nullptr;
        if (header_ok_) {
            if (token_.is("Rss"))
                target = &cur_.rss_kb;
            else if (token_.is("Pss"))
                target = &cur_.pss_kb;
            else if (token_.is("Private_Dirty"))
                target = &cur_.private_dirty_kb;
            else if (token_.is("Swap"))
                target = &cur_.swap_kb;
        }
        if (target) {
            value_.start(target);
            state_ = State::Value;
        } else {
            state_ = State::Skip;
        }
    }

    void add_perm(char c) {
        static const uint8_t bits[4] = {hslog::kRead, hslog::kWrite, hslog::kExec, hslog::kShared};
        static const char letters[4] = {'r', 'w', 'x', 's'};
        if (c == letters[perm_index_]) cur_.perms |= bits[perm_index_];
        ++perm_index_;
    }

    static bool add_hex(uint64_t* v, char c) {
        int d = hex_digit(c);
        if (d < 0) return false;
        *v = *v << 4 | static_cast<uint64_t>(d);
        return true;
    }

    // A header we cannot read: drop the region and the key lines after it.
    void bad_header() {
        header_ok_ = false;
        state_ = State::Skip;
    }

    void deliver() {
        if (!header_ok_) return;
        header_ok_ = false;
        cur_.path = path_buf_;
        cur_.path_len = static_cast<uint32_t>(path_len_);
        cb_(cur_, ctx_);
        ++count_;
    }

    char* path_buf_;
    size_t path_cap_;
    RegionCallback cb_;
    void* ctx_;

    State state_ = State::LineStart;
    FirstToken token_;
    DecimalValue value_;
    RawRegion cur_;
    size_t path_len_ = 0;
    uint32_t perm_index_ = 0;
    bool header_ok_ = false;  // cur_ had a complete header; its keys are being read
    long count_ = 0;
};

class StatusParser {
public:
    void feed(const char* p, size_t n) {
        for (size_t i = 0; i < n; ++i) step(p[i]);
    }
    void finish() {
        if (state_ != State::LineStart) step('\n');
    }

    uint64_t rss_kb = 0;
    uint64_t threads = 0;
    bool have_rss = false;
    bool have_threads = false;

private:
    enum class State : uint8_t { LineStart, Token, Value, Skip };

    void step(char c) {
        if (c == '\n') {
            if (state_ == State::Value && value_.commit()) {
                if (value_.target == &rss_kb) have_rss = true;
                if (value_.target == &threads) have_threads = true;
            }
            state_ = State::LineStart;
            return;
        }
        switch (state_) {
            case State::LineStart:
                token_.reset();
                state_ = State::Token;
                [[fallthrough]];
            case State::Token:
                if (c != ':') {
                    token_.add(c);
                } else if (token_.is("VmRSS")) {
                    value_.start(&rss_kb);
                    state_ = State::Value;
                } else if (token_.is("Threads")) {
                    value_.start(&threads);
                    state_ = State::Value;
                } else {
                    state_ = State::Skip;
                }
                break;
            case State::Value: value_.add(c); break;
            case State::Skip: break;
        }
    }

    State state_ = State::LineStart;
    FirstToken token_;
    DecimalValue value_;
};

// read() the whole file into `parser`, `n` bytes at a time. False on error.
template <class Parser>
bool read_all(int fd, char* buf, size_t n, Parser& parser) {
    for (;;) {
        ssize_t got = ::read(fd, buf, n);
        if (got < 0) {
            if (errno == EINTR) continue;
            return false;
        }
        if (got == 0) return true;
        parser.feed(buf, static_cast<size_t>(got));
    }
}

void close_keeping_errno(int fd) {
    int saved = errno;
    ::close(fd);
    errno = saved;
}

}  // namespace

size_t smaps_path_capacity(size_t scratch_size) {
    if (scratch_size < 2) return 0;
    size_t cap = scratch_size - scratch_size / 4;
    if (cap > kMaxPathKept) cap = kMaxPathKept;
    if (cap > scratch_size - 1) cap = scratch_size - 1;
    return cap;
}

long capture_smaps(const char* path, char* scratch, size_t scratch_size, RegionCallback cb, void* ctx) {
    if (scratch_size < 2) {
        errno = EINVAL;
        return -1;
    }
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t path_cap = smaps_path_capacity(scratch_size);
    SmapsParser parser(scratch, path_cap, cb, ctx);
    bool ok = read_all(fd, scratch + path_cap, scratch_size - path_cap, parser);
    close_keeping_errno(fd);
    if (!ok) return -1;
    return parser.finish();
}

bool read_status(const char* path, char* scratch, size_t scratch_size, uint64_t* rss_kb, uint32_t* threads) {
    *rss_kb = 0;
    *threads = 0;
    if (scratch_size < 1) {
        errno = EINVAL;
        return false;
    }
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    StatusParser parser;
    bool ok = read_all(fd, scratch, scratch_size, parser);
    close_keeping_errno(fd);
    if (!ok) return false;
    parser.finish();
    *rss_kb = parser.rss_kb;
    *threads = static_cast<uint32_t>(parser.threads);
    return parser.have_rss && parser.have_threads;
}

}  // namespace heapsnap::addrspace
