"""CURVE key pairs for the relay and its clients (pyzmq's zmq.auth certificate files)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq.auth


class KeyFileError(ValueError):
    """A key directory or certificate that cannot be used."""


def keygen(directory: str | os.PathLike, name: str = "server") -> tuple[Path, Path]:
    """Write NAME.key (public) and NAME.key_secret into DIR; return both paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    pub, sec = zmq.auth.create_certificates(str(d), name)
    os.chmod(sec, 0o600)
    return Path(pub), Path(sec)


def _load(path: Path, need_secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as e:
        raise KeyFileError(f"cannot read certificate {path}: {e}") from None
    if need_secret and not secret:
        raise KeyFileError(f"{path} has no secret key (need NAME.key_secret)")
    return public, secret


def _find(directory: str | os.PathLike, suffix: str, name: str | None) -> Path:
    d = Path(directory)
    if d.is_file():
        return d
    if not d.is_dir():
        raise KeyFileError(f"key directory {d} does not exist (create one with `ftis-relay keygen {d}`)")
    if name:
        p = d / f"{name}{suffix}"
        if not p.exists():
            raise KeyFileError(f"{p} not found")
        return p
    found = sorted(d.glob(f"*{suffix}"))
    if len(found) != 1:
        raise KeyFileError(f"expected exactly one *{suffix} in {d}, found {len(found)}; pass a name")
    return found[0]


def allowed_names(directory: str | os.PathLike) -> dict[bytes, str]:
    """The allow-list: public key (raw bytes) -> certificate name (file stem), which is the node id
    a client with that key may use. Two certificates with one key are refused."""
    d = Path(directory)
    if not d.is_dir():
        raise KeyFileError(f"allow directory {d} does not exist (copy each node's NAME.key into it)")
    from zmq.utils import z85
    names: dict[bytes, str] = {}
    for path in sorted(d.glob("*.key")):
        public, _ = _load(path, need_secret=False)
        public = z85.decode(public)           # ZAP hands over raw 32-byte keys
        if public in names:
            raise KeyFileError(f"{path} has the same public key as {names[public]}.key")
        names[public] = path.stem
    return names


def load_server_keys(directory: str, name: str | None = None) -> tuple[bytes, bytes]:
    """(public, secret) of the relay from DIR/NAME.key_secret (the only *.key_secret if no name)."""
    public, secret = _load(_find(directory, ".key_secret", name), need_secret=True)
    return public, secret


@dataclass(frozen=True)
class ClientKeys:
    """A client's own key pair plus the relay's public key."""

    public: bytes
    secret: bytes
    server_public: bytes

    @classmethod
    def load(cls, client_dir: str, server_key: str, name: str | None = None) -> "ClientKeys":
        """client_dir holds NAME.key_secret; server_key is the relay's public cert (file or dir)."""
        public, secret = _load(_find(client_dir, ".key_secret", name), need_secret=True)
        server_public, _ = _load(_find(server_key, ".key", None), need_secret=False)
        return cls(public, secret, server_public)

    def apply(self, sock) -> None:
        """Configure a client socket for CURVE with these keys (before connect)."""
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.server_public
