"""Frame-by-frame sends for the hot paths (the relay's fan-out and ACKs, a client's PUBs).

pyzmq's `Socket.send` is a Python wrapper (routing ids, groups) around the compiled
backend's send, and `send_multipart` adds per-frame flag arithmetic on enums: for our small
frames each cost more than the send itself (profiled, docs/relay.md "bench_relay.py").
`send_frame(sock, data, flags)` calls the backend directly, with plain-int flags.
"""
from __future__ import annotations

import zmq

try:                                    # CPython's compiled backend
    from zmq.backend.cython._zmq import Socket as _Backend
except ImportError:                     # another backend (PyPy's CFFI): the ordinary method
    _Backend = zmq.Socket

send_frame = _Backend.send
MORE = int(zmq.NOBLOCK | zmq.SNDMORE)   # non-blocking, more frames follow
LAST = int(zmq.NOBLOCK)                 # non-blocking, the message's last frame
