"""Long-term node identities for DECOR's key agreement: Ed25519 keys and a roster.

Unauthenticated Diffie-Hellman protects against the paper's passive adversaries (DECOR s.2) but
not against whoever sits between two parties: it can agree one secret with each and learn their
correlated noise. Authenticated key agreement closes that (docs/security.md s.3):

* every node ``i`` holds a long-term Ed25519 identity key (RFC 8032) -- a file only its owner
  reads (``node-<i>.ed25519``, PKCS#8 PEM, mode 0600);
* every party holds the same **roster**: node id -> Ed25519 public key (a JSON file,
  ``privdl-roster/v1``), distributed out of band (the deployment's job: a PKI, a signed config);
* in each run, node ``i`` signs its fresh X25519 public key ``pk_i`` with its identity::

      sig_i = Ed25519-Sign(id_i, ROSTER_LABEL || i (8 bytes, big-endian) || session_id || pk_i)

  and publishes ``pk_i || sig_i`` (96 bytes); a neighbour verifies ``sig_i`` against the roster's
  key of node ``i`` *before* the X25519 exchange and refuses the agreement otherwise
  (:class:`~privdl.errors.PrivacyError`, one line naming both nodes).

The X25519 keys and the derived edge secrets are exactly those of the unauthenticated protocol
(:mod:`privdl.mechanisms.secrets`), so an honest run gives the same numbers with or without a
roster. ``Roster.from_seed`` derives every identity from a seed: the same code path for a
reproducible simulation, INSECURE (whoever knows the seed can sign for every node).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
)

from privdl.errors import PrivacyError

__all__ = [
    "ROSTER_FORMAT",
    "ROSTER_LABEL",
    "SIGNATURE_BYTES",
    "Authenticator",
    "Roster",
    "identity_file",
    "load_identities",
    "make_identities",
    "signed_message",
]

ROSTER_FORMAT = "privdl-roster/v1"
ROSTER_LABEL = b"privdl/decor/signed-x25519-key/v1"
SIGNATURE_BYTES = 64
_PUBLIC_BYTES = 32
_SEEDED_IDENTITY_LABEL = b"privdl/insecure-simulation/ed25519-identity/v1"


def signed_message(node: int, public: bytes, session_id: bytes) -> bytes:
    """What node ``node`` signs: the label, its id, the run's session id and its X25519 key."""
    return ROSTER_LABEL + int(node).to_bytes(8, "big") + b"|session|" + session_id + public


def _raw_public(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def _seeded_identity(seed: int, node: int) -> Ed25519PrivateKey:
    ikm = str(int(seed)).encode("ascii")
    info = _SEEDED_IDENTITY_LABEL + b"|node|" + int(node).to_bytes(8, "big")
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(ikm)
    return Ed25519PrivateKey.from_private_bytes(raw)


@dataclass(frozen=True)
class Roster:
    """Node id -> Ed25519 public key (32 raw bytes): who may sign for which node."""

    keys: Mapping[int, bytes]

    def verify(self, node: int, public: bytes, signature: bytes, session_id: bytes) -> None:
        """Refuse (PrivacyError) unless ``signature`` is node ``node``'s over ``public``."""
        known = self.keys.get(int(node))
        if known is None:
            raise PrivacyError(f"node {node} is not in the roster: its key cannot be authenticated")
        try:
            Ed25519PublicKey.from_public_bytes(known).verify(
                bytes(signature), signed_message(node, bytes(public), session_id)
            )
        except InvalidSignature:
            raise PrivacyError(
                f"the X25519 key received for node {node} is not signed by node {node}'s identity "
                "in the roster: key agreement refused (a substituted key: a man in the middle?)"
            ) from None

    def save(self, path: str | Path) -> Path:
        """Write the roster (public: any mode) as ``privdl-roster/v1`` JSON."""
        path = Path(path)
        payload = {
            "format": ROSTER_FORMAT,
            "nodes": {str(i): k.hex() for i, k in self.keys.items()},
        }
        path.write_text(json.dumps(payload, indent=1) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Roster:
        """Read a roster file; a malformed one is a one-line PrivacyError."""
        try:
            payload = json.loads(Path(path).read_text())
            if not isinstance(payload, dict) or payload.get("format") != ROSTER_FORMAT:
                raise ValueError(f"not a {ROSTER_FORMAT} file")
            keys = {int(i): bytes.fromhex(k) for i, k in payload["nodes"].items()}
            if any(len(k) != _PUBLIC_BYTES for k in keys.values()):
                raise ValueError("an Ed25519 public key is 32 bytes")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise PrivacyError(f"cannot read the roster {path}: {exc}") from None
        return cls(keys)

    @classmethod
    def from_seed(cls, seed: int, n_nodes: int) -> Roster:
        """Every node's identity derived from ``seed`` (INSECURE: reproducible simulation)."""
        return cls({i: _raw_public(_seeded_identity(seed, i)) for i in range(n_nodes)})


@dataclass(frozen=True)
class Authenticator:
    """What one process needs to authenticate its nodes' keys: the roster and the identity keys
    of the nodes it owns (never printed, never pickled)."""

    roster: Roster
    identities: Mapping[int, Ed25519PrivateKey] = field(repr=False)

    def __post_init__(self) -> None:
        for node, key in self.identities.items():
            if self.roster.keys.get(node) != _raw_public(key):
                raise PrivacyError(
                    f"the identity key of node {node} does not match its key in the roster"
                )

    def __reduce__(self) -> tuple:
        raise TypeError("an Authenticator holds private keys and is not picklable")

    def sign(self, node: int, public: bytes, session_id: bytes) -> bytes:
        """``public || signature`` of an owned node (what it publishes)."""
        key = self.identities.get(int(node))
        if key is None:
            raise PrivacyError(f"no identity key for node {node} in this process")
        return bytes(public) + key.sign(signed_message(node, bytes(public), session_id))

    def open(self, node: int, payload: bytes, session_id: bytes) -> bytes:
        """The verified X25519 key of ``node`` from its published ``payload`` (or a refusal)."""
        if len(payload) != _PUBLIC_BYTES + SIGNATURE_BYTES:
            raise PrivacyError(
                f"node {node} published {len(payload)} bytes, not a signed key "
                f"({_PUBLIC_BYTES + SIGNATURE_BYTES}): key agreement refused"
            )
        public, signature = bytes(payload[:_PUBLIC_BYTES]), bytes(payload[_PUBLIC_BYTES:])
        self.roster.verify(node, public, signature, session_id)
        return public

    @classmethod
    def from_seed(cls, seed: int, n_nodes: int, nodes: Iterable[int]) -> Authenticator:
        """The simulation's identities (:meth:`Roster.from_seed`), for ``nodes``."""
        return cls(Roster.from_seed(seed, n_nodes), {i: _seeded_identity(seed, i) for i in nodes})


def identity_file(folder: str | Path, node: int) -> Path:
    """Where node ``node``'s identity key lives in an identities folder."""
    return Path(folder) / f"node-{int(node)}.ed25519"


def load_identities(folder: str | Path, nodes: Iterable[int]) -> dict[int, Ed25519PrivateKey]:
    """The identity keys of ``nodes`` (only those: a process reads its own nodes' files)."""
    out = {}
    for node in nodes:
        path = identity_file(folder, node)
        try:
            key = load_pem_private_key(path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise PrivacyError(
                f"cannot read the identity key of node {node} ({path}): {exc}"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise PrivacyError(f"{path} is not an Ed25519 private key")
        out[int(node)] = key
    return out


def make_identities(n_nodes: int, folder: str | Path) -> Roster:
    """Fresh identities (OS randomness) for nodes ``0..n-1``: ``folder/node-<i>.ed25519``
    (mode 0600, folder 0700) and ``folder/roster.json``; returns the roster. A deployment gives
    each party only its own key files and everyone the roster."""
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    public = {}
    for node in range(n_nodes):  # setup, once per deployment
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
        fd = os.open(identity_file(folder, node), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        public[node] = _raw_public(key)
    roster = Roster(public)
    roster.save(folder / "roster.json")
    return roster
