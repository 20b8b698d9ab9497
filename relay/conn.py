"""A client's connection under the relay's ROUTER socket: which one it is, and cutting it.

ZeroMQ gives no way to close one peer of a ROUTER, nor to take back what is queued for it. A
received message names the file descriptor it came in on (SRCFD); shutting that socket down
makes libzmq close the connection and free its pipe, as if the client had hung up. The fd is
checked against the addresses noted when it said HELLO, so a number the kernel has since given
to another connection is left alone."""
from __future__ import annotations

import ipaddress
import os
import socket


def source_of(key_name: str | None, address: str, rid: bytes) -> bytes:
    """Where a publisher connects from, for the budgets' newcomer order (relay.budget): its
    CURVE key, else its address (an IPv6 /64: one machine's usual share), else the connection
    (routing id `rid`). A bridge's rollouts share the bridge's: the relay cannot see their
    origin's."""
    if key_name:
        return b"k" + key_name.encode()
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return b"c" + rid
    if ip.version == 6:
        if ip.ipv4_mapped is None:
            return b"a" + str(ipaddress.ip_network(f"{ip}/64", strict=False)).encode()
        ip = ip.ipv4_mapped
    return b"a" + str(ip).encode()


def fd_of(frame) -> int | None:
    """The fd a received ZeroMQ frame came in on (None where libzmq does not say)."""
    import zmq
    try:
        return frame.get(zmq.SRCFD)
    except (zmq.ZMQError, AttributeError):
        return None


def identify(fd: int | None) -> tuple:
    """(fd, (local address, peer address)) of a connection, () when unknown."""
    if fd is None or fd < 0:
        return ()
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            return fd, (s.getsockname(), s.getpeername())
    except OSError:
        return ()


def cut(conn: tuple) -> bool:
    """Shut the connection `identify` described down; False when it is not there any more."""
    if not conn:
        return False
    fd, names = conn
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            if (s.getsockname(), s.getpeername()) != names:
                return False
            s.shutdown(socket.SHUT_RDWR)
            return True
    except OSError:
        return False
