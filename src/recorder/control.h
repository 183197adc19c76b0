// The control channel through which `heapsnap snapshot PID` asks a running
// recorded process for a marker, `heapsnap ps` asks who it is, and
// `heapsnap pause`/`resume PID` switch the capture of stacks (steering.h).
//
// A Unix stream socket in the abstract namespace named "heapsnap.<pid>"
// (formats/control.md): no file to clean up or to race on in /tmp, no signal
// number taken from the program. Abstract names belong to nobody: when
// another process holds that one, the recorder says so and listens on
// "heapsnap.<pid>.<n>" instead, and clients believe only a listener whose
// SO_PEERCRED pid is the process's. The writer thread accepts connections; a
// peer whose SO_PEERCRED uid is neither 0 nor the process's current real
// or effective uid gets "error permission denied" and nothing else
// happens. The writer never blocks on a client: requests are read as they
// arrive, with a 1 s deadline. A request only names a marker label (or
// asks for `info`, or pauses or resumes stacks): it cannot make the
// process write anywhere else. The
// reply to `snapshot` carries the log's descriptor (SCM_RIGHTS), so the
// client reads the very file the process writes, whether or not it could
// open the log's path.
#pragma once

#include <poll.h>

#include <cstdint>

namespace heapsnap::recorder {

void control_open();
void control_close();
void control_forget_after_fork();
// The listening socket, or -1.
int control_fd();
// The descriptors the writer should wait on (listening socket, connections
// whose request is still arriving); returns how many were written to out.
int control_poll_fds(pollfd* out, int max);
// Accepts connections and reads what their requests sent so far, never
// blocking; takes the markers of complete requests.
void control_poll();
// Connections whose request is still arriving: control_poll has work
// even when none of control_poll_fds is ready (their deadlines).
bool control_reading();
// Answers a `detach` request on `fd` once the log has ended (writer.h,
// writer_request_detach).
void control_reply_detached(int fd);
// Answers requests whose marker is now on disk.
void control_reply_durable(uint32_t durable_marker);

}  // namespace heapsnap::recorder
