// The control channel through which `heapsnap snapshot PID` asks a running
// recorded process for a marker.
//
// A Unix stream socket in the abstract namespace named "heapsnap.<pid>"
// (formats/control.md): no file to clean up or to race on in /tmp, no signal
// number taken from the program. The writer thread accepts connections; a
// peer whose SO_PEERCRED uid differs from the process's real uid gets
// "error permission denied" and nothing else happens. The writer never
// blocks on a client: requests are read as they arrive, with a 1 s
// deadline. A request only names
// a marker label: it cannot make the process write anywhere else.
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
// Answers requests whose marker is now on disk.
void control_reply_durable(uint32_t durable_marker);

}  // namespace heapsnap::recorder
