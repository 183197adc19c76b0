#include "replay/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "format/framed_file.h"
#include "format/snapshot_file.h"
#include "util/diagnostics.h"
#include "util/error.h"
#include "util/files.h"
#include "util/read_budget.h"

namespace heapsnap {
namespace {

// Version 2: the stream position carries the stack count and highest id.
// Version 3 (log version 2): and the reader's block-id allocator (next id,
// free list); live blocks are kept by id, with their address if the log has
// it, and their weight (sampled logs); sample_bytes in the process.
// Version 4 (log version 3): the reader's allocation infos (fn, size, stack
// and live count of each) and live addressed blocks instead of block ids;
// live blocks are kept per info, oldest first, or by address.
// Version 5 (log version 5): markers as in snapshot version 3, their
// mallinfo2 numbers after a presence byte.
// Version 6 (log version 9): the process's `attached` byte and the totals
// of frees of blocks allocated before recording, as in snapshot version 5.
const FileKind kCheckpointKind{"HSNAPCKP", 6, "checkpoint"};
constexpr size_t kFingerprintBytes = 4096;

// FNV-1a over the log's first bytes (its header and process record): ties
// a checkpoint to one log even if another log later takes its name.
uint64_t fingerprint(const LogFile& log) {
    unsigned char buf[kFingerprintBytes];
    ssize_t n = 0;
    if (log.fd >= 0) {
        n = pread(log.fd, buf, sizeof buf, 0);
    } else {
        try {
            n = pread(open_regular_file(log.path).get(), buf, sizeof buf, 0);
        } catch (const Error&) {
            return 0;
        }
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (ssize_t i = 0; i < n; ++i) h = (h ^ buf[i]) * 0x100000001b3ull;
    return h ^ static_cast<uint64_t>(n);
}

// The directory that holds the log, open, and the checkpoint's name in it.
struct Place {
    UniqueFd dir;
    std::string name;
    std::string shown;  // the checkpoint's path, for messages
};

std::optional<Place> place_of(const LogFile& log) {
    size_t slash = log.path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : log.path.substr(0, slash);
    std::string base = slash == std::string::npos ? log.path : log.path.substr(slash + 1);
    if (base.empty()) return std::nullopt;
    UniqueFd dir_fd(open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!dir_fd) return std::nullopt;
    if (log.fd >= 0) {
        struct stat named, held;
        if (fstatat(dir_fd.get(), base.c_str(), &named, AT_SYMLINK_NOFOLLOW) != 0 || fstat(log.fd, &held) != 0 ||
            named.st_dev != held.st_dev || named.st_ino != held.st_ino)
            return std::nullopt;
    }
    return Place{std::move(dir_fd), base + ".checkpoint", checkpoint_path(log.path)};
}

// A checkpoint is trusted only as the caller's own file: regular, owned
// by the caller's effective uid, mode 0600, as save_checkpoint makes it.
// Anything else at its name (a FIFO another user planted in /tmp, a
// symlink, a device, a file of someone else's) is never opened, read,
// written through or replaced: the checkpoint is left unused, with one
// warning per process.
bool trusted(const struct stat& st) {
    return S_ISREG(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 07777) == 0600;
}

enum class Found { Nothing, Trusted, Untrusted };

Found look_at(const Place& place) {
    struct stat st;
    if (fstatat(place.dir.get(), place.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return Found::Nothing;
    if (trusted(st)) return Found::Trusted;
    static bool warned = false;
    if (!warned) {
        warned = true;
        warn(place.shown + ": not a regular file of yours with mode 0600; left alone, and no checkpoint is used");
    }
    return Found::Untrusted;
}

}  // namespace

std::string checkpoint_path(const std::string& log) { return log + ".checkpoint"; }

bool checkpoints_enabled() {
    const char* off = std::getenv("HEAPSNAP_NO_CHECKPOINT");
    return !(off && *off && std::string(off) != "0");
}

std::optional<Checkpoint> load_checkpoint(const LogFile& log) {
    std::optional<Place> place = place_of(log);
    if (!place || look_at(*place) != Found::Trusted) return std::nullopt;
    try {
        // O_NOFOLLOW | O_NONBLOCK, and checked again once open: the name
        // may have been replaced since look_at.
        UniqueFd fd(
            openat(place->dir.get(), place->name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY));
        struct stat st;
        if (!fd || fstat(fd.get(), &st) != 0 || !trusted(st)) return std::nullopt;
        budget_add_input(fd.get());
        std::vector<uint8_t> file = read_open_file(fd.get(), place->shown);
        Checkpoint c;
        c.body = decode_framed(place->shown, kCheckpointKind, file, c.held);
        codec::Reader r(c.body.data(), c.body.size());
        if (r.varint() != fingerprint(log)) return std::nullopt;
        c.position.offset = r.varint();
        c.position.time_ns = r.varint();
        c.position.address = r.varint();
        c.position.thread = static_cast<uint32_t>(r.varint());
        c.position.stacks = r.varint();
        c.position.max_stack = static_cast<uint32_t>(r.varint());
        c.position.infos.assign(1, AllocInfo{});
        for (uint64_t n = r.count(4); n-- && r.ok();) {
            AllocInfo info;
            uint8_t fn = r.u8();
            info.size = r.varint();
            info.stack = static_cast<uint32_t>(r.varint());
            info.live = static_cast<uint32_t>(r.varint());
            if (fn >= hslog::kAllocFnCount) r.invalidate();
            info.fn = static_cast<hslog::AllocFn>(fn);
            c.position.infos.push_back(info);
        }
        for (uint64_t n = r.count(1); n-- && r.ok();) c.position.addressed.push_back(r.varint());
        for (uint64_t n = r.count(4); n-- && r.ok();) {
            MarkerRecord m;
            bool has_data;
            get_marker(r, m, has_data);
            c.markers.push_back(std::move(m));
        }
        c.state_offset = static_cast<size_t>(r.position() - c.body.data());
        if (!r.ok()) return std::nullopt;
        if (AllocInfos infos; !infos.restore(c.position.infos, c.position.addressed)) return std::nullopt;
        return c;
    } catch (const Error&) {
        return std::nullopt;
    }
}

std::optional<FileStamp> save_checkpoint(const LogFile& log, const StreamPosition& position,
                                         const std::vector<MarkerRecord>& markers, const Replay& replay) {
    std::optional<Place> place = place_of(log);
    if (!place || look_at(*place) == Found::Untrusted) return std::nullopt;
    // The state, then its compressed copy: a cache not worth more memory
    // than the read budget has left (util/read_budget.h).
    MemoryCharge held;
    try {
        held.take(2 * replay.state_bytes_bound(), "the checkpoint");
    } catch (const BudgetExceeded&) {
        return std::nullopt;
    }
    ByteBuffer o;
    o.varint(fingerprint(log));
    o.varint(position.offset);
    o.varint(position.time_ns);
    o.varint(position.address);
    o.varint(position.thread);
    o.varint(position.stacks);
    o.varint(position.max_stack);
    o.varint(position.infos.size() - 1);
    for (size_t i = 1; i < position.infos.size(); ++i) {
        const AllocInfo& info = position.infos[i];
        o.u8(static_cast<uint8_t>(info.fn));
        o.varint(info.size);
        o.varint(info.stack);
        o.varint(info.live);
    }
    o.varint(position.addressed.size());
    for (uint64_t address : position.addressed) o.varint(address);
    o.varint(markers.size());
    for (const MarkerRecord& m : markers) put_marker(o, m, false);
    replay.save_state(o);
    try {
        return write_file_atomically_at(place->dir.get(), place->name,
                                        encode_framed(place->shown, kCheckpointKind, o.bytes()), place->shown);
    } catch (const Error&) {
        return std::nullopt;  // a cache that cannot be written costs speed, not results
    }
}

std::optional<FileStamp> checkpoint_stamp(const LogFile& log) {
    std::optional<Place> place = place_of(log);
    struct stat st;
    if (!place || fstatat(place->dir.get(), place->name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
    return stamp_of(st);
}

}  // namespace heapsnap
