"""The holder: keeps each job's fabric alive while the agent restarts.

A job's spine and rack namespaces are named only inside the agent's mount namespace,
so without the holder an agent that dies (OOM-killed, crashed, restarted by its
liveness probe) takes them with it, and with them every veth into the job's pods.
The holder is a second container of the agent's pod, with no capability: the agent
hands it an open file of each namespace it built (SCM_RIGHTS over a Unix socket on a
volume only the pod's containers share), and a namespace stays alive while an open
file refers to it. A new agent asks for them back, names them again and adopts the
fabrics instead of building them anew (daemon.Agent.adopt_held).

When the whole pod goes (deleted, rolled, the chart uninstalled), the kubelet stops
both containers: the holder says it is stopping, the agent then removes every fabric
as before, and whatever is left is freed by the kernel once the holder exits. When
only the agent's container stops, the holder is not stopping and the agent leaves its
fabrics to its successor.

Protocol (SOCK_SEQPACKET, one request per packet, ASCII): ``HOLD <name> <tag>`` with
one file descriptor (the tag says what the namespace was built for), ``DROP <name>``,
``LIST`` (answered by one ``HELD <name> <tag>`` packet per held namespace, each with
its descriptor, then ``END``), ``STATE`` (answered by
``RUNNING`` or ``STOPPING``). A bad request is answered ``ERROR <why>`` and the
connection stays open.
"""

from __future__ import annotations

import array
import logging
import os
import re
import resource
import selectors
import signal
import socket
import sys
import time
from typing import Any, NamedTuple, Optional

log = logging.getLogger("tailcut.holder")

ENV_SOCKET = "TAILCUT_HOLDER_SOCKET"
PACKET_BYTES = 512
NAME = re.compile(r"[A-Za-z0-9._@-]{1,200}")  # a netns name of the agent (podns.PREFIX...)
TAG = re.compile(r"[A-Za-z0-9:_-]{0,100}")
MAX_HELD = 4096
MAX_CONNECTIONS = 8
CONNECTION_TIMEOUT_S = 5.0
# How long a stopping holder waits for the agent to say it has removed its fabrics.
STOPPING_GRACE_S = 20.0


class Held(NamedTuple):
    fd: int    # an open file of the namespace
    tag: str   # what it was built for (daemon: the job's incarnation and spec)


class HolderError(Exception):
    """The holder refused a request or could not be reached."""


class _Closed(HolderError):
    """The connection to the holder is gone (it restarted): ask on a new one."""


def _send(sock: socket.socket, text: str, fd: Optional[int] = None) -> None:
    ancillary = [] if fd is None else [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                        array.array("i", [fd]))]
    sock.sendmsg([text.encode()], ancillary)


def _receive(sock: socket.socket) -> tuple[str, list[int]]:
    """One packet: its text and the descriptors that came with it (every one of them
    is the caller's to close)."""
    fds = array.array("i")
    data, ancillary, flags, _ = sock.recvmsg(PACKET_BYTES, socket.CMSG_SPACE(4 * 4))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        for fd in fds:
            os.close(fd)
        return "", []
    return data.decode("ascii", "replace"), list(fds)


class Server:
    """The holder's side: the namespaces it holds, by name."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}
        self.tags: dict[str, str] = {}
        self.stopping_since: Optional[float] = None

    def answer(self, conn: socket.socket) -> bool:
        """Serve one request on `conn`; False when the peer has closed it."""
        text, fds = _receive(conn)
        if not text and not fds:
            return False
        verb, _, name = text.partition(" ")
        try:
            reply = self._do(conn, verb, name, fds)
        except HolderError as err:
            reply = f"ERROR {err}"
        finally:
            for fd in fds:   # any descriptor not taken into self.held
                if fd not in self.held.values():
                    os.close(fd)
        if reply:
            _send(conn, reply)
        return True

    def _do(self, conn: socket.socket, verb: str, name: str, fds: list[int]) -> str:
        if verb == "STATE":
            return "STOPPING" if self.stopping_since is not None else "RUNNING"
        if verb == "LIST":
            for held_name, fd in sorted(self.held.items()):
                _send(conn, f"HELD {held_name} {self.tags[held_name]}", fd)
            return "END"
        name, _, tag = name.partition(" ")
        if not NAME.fullmatch(name):
            raise HolderError(f"{verb}: {name!r} is not a namespace name of the agent")
        if verb == "DROP":
            dropped = self.held.pop(name, None)
            self.tags.pop(name, None)
            if dropped is not None:
                os.close(dropped)
            return "OK"
        if verb == "HOLD":
            if not TAG.fullmatch(tag):
                raise HolderError(f"HOLD {name}: {tag!r} is not a tag")
            if len(fds) != 1:
                raise HolderError(f"HOLD {name}: {len(fds)} descriptors, not one")
            if name not in self.held and len(self.held) >= MAX_HELD:
                raise HolderError(f"HOLD {name}: {MAX_HELD} namespaces held already")
            old = self.held.pop(name, None)
            if old is not None:
                os.close(old)
            self.held[name], self.tags[name] = fds[0], tag
            return "OK"
        raise HolderError(f"unknown request {verb!r}")

    def release_all(self) -> None:
        for fd in self.held.values():
            os.close(fd)
        self.held.clear()
        self.tags.clear()


def serve(path: str) -> int:
    """Hold namespaces for the agent until SIGTERM, then until the agent says it is
    done (``DROP`` of everything) or STOPPING_GRACE_S pass."""
    server = Server()
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "stopping_since",
                                                     time.monotonic()))
    _allow_descriptors(MAX_HELD + 2 * MAX_CONNECTIONS + 64)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(MAX_CONNECTIONS)
    # epoll, not select(): a held namespace takes a descriptor, and select() fails on
    # any numbered 1024 or more.
    ready = selectors.DefaultSelector()
    ready.register(listener, selectors.EVENT_READ)
    log.info("holding the agent's namespaces at %s", path)
    while True:
        since = server.stopping_since
        if since is not None and (not server.held
                                  or time.monotonic() - since > STOPPING_GRACE_S):
            break
        for key, _ in ready.select(1.0):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                conn = listener.accept()[0]
                if len(ready.get_map()) > MAX_CONNECTIONS:
                    conn.close()   # the agent needs one; nothing else has the socket
                    continue
                conn.settimeout(CONNECTION_TIMEOUT_S)   # a peer that never reads
                ready.register(conn, selectors.EVENT_READ)
                continue
            try:
                alive = server.answer(sock)
            except OSError:
                alive = False
            if not alive:
                ready.unregister(sock)
                sock.close()
    log.info("stopping; %d namespaces still held are freed with this process",
             len(server.held))
    server.release_all()
    return 0


def _allow_descriptors(wanted: int) -> None:
    """Raise the soft limit on open files towards `wanted` (as far as the hard one)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        top = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (top, hard))


class Client:
    """The agent's side."""

    def __init__(self, path: str, timeout_s: float = 5.0) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._sock: Optional[socket.socket] = None

    def _conn(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.settimeout(self.timeout_s)
            try:
                sock.connect(self.path)
            except OSError as err:
                sock.close()
                raise HolderError(f"cannot reach the holder at {self.path}: {err}") from None
            self._sock = sock
        return self._sock

    def _ask(self, text: str, fd: Optional[int] = None) -> str:
        """The holder's reply to one request; on a connection the holder closed (it
        restarted), once more on a new one."""
        for attempt in (1, 2):
            try:
                sock = self._conn()
                _send(sock, text, fd)
                reply, fds = _receive(sock)
            except (OSError, HolderError) as err:
                self.close()
                if attempt == 2:
                    raise HolderError(f"holder: {text.split()[0]}: {err}") from None
                continue
            for extra in fds:
                os.close(extra)
            if reply:
                break
            self.close()   # the holder closed it: ask again
        if reply.startswith("ERROR"):
            raise HolderError(f"holder: {reply[6:]}")
        if not reply:
            raise HolderError(f"holder: {text.split()[0]}: no reply")
        return reply

    def _ok(self, text: str, fd: Optional[int] = None) -> None:
        reply = self._ask(text, fd)
        if reply != "OK":
            raise HolderError(f"holder: {text.split()[0]}: unexpected reply {reply!r}")

    def hold(self, name: str, path: str, tag: str) -> None:
        """Hand the holder an open file of the namespace at `path`, as `name`, built
        for what `tag` says."""
        fd = os.open(path, os.O_RDONLY)
        try:
            self._ok(f"HOLD {name} {tag}", fd)
        finally:
            os.close(fd)

    def drop(self, name: str) -> None:
        self._ok(f"DROP {name}")

    def stopping(self) -> bool:
        return self._ask("STATE") == "STOPPING"

    def held(self) -> dict[str, Held]:
        """Every namespace held, each with a descriptor now the caller's to close; on
        a connection the holder closed (it restarted), asked once more on a new one."""
        try:
            return self._list()
        except _Closed:
            self.close()
        try:
            return self._list()
        except _Closed as err:
            self.close()
            raise HolderError(f"holder: LIST: {err}") from None

    def _list(self) -> dict[str, Held]:
        out: dict[str, Held] = {}
        try:
            sock = self._conn()
            _send(sock, "LIST")
            while True:
                reply, fds = _receive(sock)
                verb, _, rest = reply.partition(" ")
                name, _, tag = rest.partition(" ")
                if verb == "HELD" and len(fds) == 1:
                    out[name] = Held(fds[0], tag)
                    continue
                for fd in fds:
                    os.close(fd)
                if reply == "END":
                    return out
                if not reply and not out:
                    raise _Closed("the holder closed the connection")
                raise HolderError(f"holder: LIST: unexpected {reply!r}")
        except BaseException as err:
            for held in out.values():
                os.close(held.fd)
            if isinstance(err, OSError):
                raise _Closed(str(err)) from None
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def from_environment() -> Optional[Client]:
    path = os.environ.get(ENV_SOCKET)
    return Client(path) if path else None


def main(argv: Optional[list[Any]] = None) -> int:
    """`python -m tailcut.k8s.agent.holder SOCKET`: the holder container's command."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = sys.argv[1:] if argv is None else argv
    path = args[0] if args else os.environ.get(ENV_SOCKET, "")
    if not path:
        print("tailcut holder: give the socket's path (or set TAILCUT_HOLDER_SOCKET)",
              file=sys.stderr)
        return 2
    return serve(path)


if __name__ == "__main__":
    sys.exit(main())
