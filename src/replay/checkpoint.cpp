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
const FileKind kCheckpointKind{"HSNAPCKP", 3, "checkpoint"};
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
        c.position.next_block = static_cast<uint32_t>(r.varint());
        for (uint64_t n = r.count(1); n-- && r.ok();) c.position.free_blocks.push_back(static_cast<uint32_t>(r.varint()));
        for (uint64_t n = r.count(4); n-- && r.ok();) {
            MarkerRecord m;
            bool has_data;
            get_marker(r, m, has_data);
            c.markers.push_back(std::move(m));
        }
        c.state.assign(r.position(), r.position() + r.remaining());
        if (!r.ok()) return std::nullopt;
        if (BlockIds ids; !ids.restore(c.position.next_block, c.position.free_blocks)) return std::nullopt;
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
    o.varint(position.next_block);
    o.varint(position.free_blocks.size());
    for (uint32_t id : position.free_blocks) o.varint(id);
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
