#include "replay/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include "format/framed_file.h"
#include "format/snapshot_file.h"
#include "util/error.h"

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
const FileKind kCheckpointKind{"HSNAPCKP", 5, "checkpoint"};
constexpr size_t kFingerprintBytes = 4096;

// FNV-1a over the log's first bytes (its header and process record): ties
// a checkpoint to one log even if another log later takes its name.
uint64_t fingerprint(const std::string& log) {
    int fd = open(log.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    unsigned char buf[kFingerprintBytes];
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    uint64_t h = 0xcbf29ce484222325ull;
    for (ssize_t i = 0; i < n; ++i) h = (h ^ buf[i]) * 0x100000001b3ull;
    return h ^ static_cast<uint64_t>(n);
}

}  // namespace

std::string checkpoint_path(const std::string& log) { return log + ".checkpoint"; }

std::optional<Checkpoint> load_checkpoint(const std::string& log) {
    if (!has_magic(checkpoint_path(log), kCheckpointKind.magic)) return std::nullopt;
    try {
        std::vector<uint8_t> body = read_framed_file(checkpoint_path(log), kCheckpointKind);
        codec::Reader r(body.data(), body.size());
        if (r.varint() != fingerprint(log)) return std::nullopt;
        Checkpoint c;
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
        c.state.assign(r.position(), r.position() + r.remaining());
        if (!r.ok()) return std::nullopt;
        if (AllocInfos infos; !infos.restore(c.position.infos, c.position.addressed)) return std::nullopt;
        return c;
    } catch (const Error&) {
        return std::nullopt;
    }
}

void save_checkpoint(const std::string& log, const StreamPosition& position, const std::vector<MarkerRecord>& markers,
                     const Replay& replay) {
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
        write_framed_file(checkpoint_path(log), kCheckpointKind, o.bytes());
    } catch (const Error&) {
        // A cache that cannot be written costs speed, not results.
    }
}

}  // namespace heapsnap
