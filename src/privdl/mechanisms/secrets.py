"""Per-edge secrets for DECOR: X25519 key agreement + HKDF-SHA256 (paper s.2; docs/secrets.md).

DECOR assumes that every edge {i, j} shares a secret seed S_ij known to i and j only, "agreed once
with one round of encrypted communication" (paper s.2, as in secure aggregation). This module is
that round: every node makes an X25519 key pair, publishes its public key through a
:class:`KeyTransport`, collects its neighbours' public keys, and derives for each incident edge the
32-byte edge secret

    secret_e = HKDF-SHA256(ikm = X25519(sk_i, pk_j), salt = none, length = 32,
                           info = label || u || v || pk_u || pk_v || session_id)

with e = {u, v}, u < v (see docs/secrets.md for the exact byte layout). Both endpoints compute the
same value; only public keys cross the transport. The edge secret is the stream key of the edge's
correlated-noise stream (:func:`privdl.mechanisms.correlated.correlated_noise`).

The single-process simulator runs the very same code with :class:`LocalKeyTransport`; a distributed
run plugs a transport over its communicator into the same :func:`agree_edge_secrets` call, for the
nodes that process owns.

Threat model note: without an ``authenticator`` the exchange is unauthenticated Diffie-Hellman,
which protects against the passive adversaries of the paper (external eavesdropper,
honest-but-curious users) but not against an active man in the middle. With one
(:class:`~privdl.mechanisms.identity.Authenticator`: a roster of Ed25519 identities and the owned
nodes' identity keys) every X25519 public key travels signed and is verified against the roster
before the exchange; a substituted key is refused (docs/security.md s.3).
"""

from __future__ import annotations

import hmac
import json
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from privdl.errors import GraphError, PrivacyError
from privdl.mechanisms.identity import Authenticator

__all__ = [
    "EDGE_SECRET_LABEL",
    "EdgeSecrets",
    "KeyTransport",
    "LocalKeyTransport",
    "agree_edge_secrets",
    "as_edge_array",
    "node_noise_keys",
]

EDGE_SECRET_LABEL = b"privdl/decor/edge-secret/v1"
_NODE_KEY_LABEL = b"privdl/insecure-simulation/x25519-private-key/v1"
_NODE_NOISE_LABEL = b"privdl/insecure-simulation/node-noise-key/v1"
_SECRET_FILE_SUFFIX = ".secrets.json"


def as_edge_array(edges: Any, n_nodes: int | None = None) -> np.ndarray:
    """Validate an undirected edge list as an (E, 2) int64 array with u < v, no duplicates."""
    array = np.asarray(edges, dtype=np.int64) if len(edges) else np.zeros((0, 2), np.int64)
    if array.ndim != 2 or array.shape[1] != 2:
        raise GraphError(f"edges must have shape (E, 2); got {array.shape}")
    if np.any(array[:, 0] >= array[:, 1]):
        raise GraphError("each edge (u, v) must satisfy u < v (no self-loops, sorted endpoints)")
    if np.any(array < 0) or (n_nodes is not None and np.any(array >= n_nodes)):
        raise GraphError(f"edge endpoints must lie in [0, {n_nodes}); check the node numbering")
    if len(array) > 1 and _has_duplicates(array):
        raise GraphError("edges contain duplicates; list each undirected edge once")
    return array


def _has_duplicates(array: np.ndarray) -> bool:
    """Whether an (E, 2) array of non-negative ids repeats a row (one sort of ``u * (max + 1) +
    v``, exact while that fits in int64; rows compared otherwise)."""
    top = int(array.max()) + 1
    if top < 3_000_000_000:
        flat = np.sort(array[:, 0] * top + array[:, 1])
        return bool(np.any(flat[1:] == flat[:-1]))
    return len(np.unique(array, axis=0)) != len(array)


def _seed_bytes(seed: int | bytes) -> bytes:
    if isinstance(seed, bytes):
        return seed
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return str(seed).encode("ascii")
    raise PrivacyError(f"seed must be a non-negative int or bytes; got {seed!r}")


def _hkdf(ikm: bytes, info: bytes) -> bytes:
    """HKDF-SHA256 with no salt and 32 bytes of output (RFC 5869 Section 2): extract
    ``PRK = HMAC(0^32, ikm)``, then the one expand block ``T(1) = HMAC(PRK, info || 0x01)``.
    Written with :func:`hmac.digest` (the same bytes as ``cryptography``'s ``HKDF``, which the
    tests compare, at a few times less per call: hundreds of thousands of calls at 10^5 nodes)."""
    prk = hmac.digest(_HKDF_ZERO_SALT, ikm, "sha256")
    return hmac.digest(prk, info + b"\x01", "sha256")


_HKDF_ZERO_SALT = bytes(32)  # RFC 5869 s.2.2: no salt is HashLen zero bytes
_EDGE_IDS = struct.Struct(">QQ")  # u, v: 8 bytes each, big-endian


def _node_id(node: int) -> bytes:
    return int(node).to_bytes(8, "big")


def edge_info(u: int, v: int, public_u: bytes, public_v: bytes, session_id: bytes) -> bytes:
    """HKDF ``info`` binding the protocol label, the sorted endpoints, both public keys, the run."""
    return (
        EDGE_SECRET_LABEL
        + b"|edge|"
        + _node_id(u)
        + _node_id(v)
        + b"|keys|"
        + public_u
        + public_v
        + b"|session|"
        + session_id
    )


def neighbour_lists(array: np.ndarray, n_nodes: int) -> dict[int, list[int]]:
    """Each node's neighbours in the order of the edges that join them (one stable sort)."""
    src = array.ravel()  # u0, v0, u1, v1, ...
    dst = array[:, ::-1].ravel()
    order = np.argsort(src, kind="stable")
    bounds = np.searchsorted(src[order], np.arange(n_nodes + 1)).tolist()
    flat = dst[order].tolist()
    return {i: flat[bounds[i] : bounds[i + 1]] for i in range(n_nodes)}


@runtime_checkable
class KeyTransport(Protocol):
    """Carries public keys between neighbours; nothing else may cross it.

    ``publish`` is called for every node a process owns before any ``collect``; ``collect`` returns
    the public keys of the node's neighbours (blocking, in a distributed transport, until they
    arrived).
    """

    def publish(self, node: int, public_bytes: bytes) -> None: ...

    def collect(self, node: int) -> Mapping[int, bytes]: ...


class LocalKeyTransport:
    """In-process transport for the simulator. Records everything it carries in ``carried``."""

    def __init__(self, edges: Any, n_nodes: int) -> None:
        array = as_edge_array(edges, n_nodes)
        self.neighbours = neighbour_lists(array, n_nodes)
        self._board: dict[int, bytes] = {}
        self.carried: list[tuple[str, int, int, bytes]] = []  # (kind, from, to, payload)

    def publish(self, node: int, public_bytes: bytes) -> None:
        self._board[node] = bytes(public_bytes)
        self.carried.append(("publish", node, -1, bytes(public_bytes)))

    def collect(self, node: int) -> dict[int, bytes]:
        missing = [j for j in self.neighbours[node] if j not in self._board]
        if missing:
            raise PrivacyError(f"node {node}: neighbours {missing} have not published a public key")
        out = {j: self._board[j] for j in self.neighbours[node]}
        self.carried.extend(("deliver", j, node, key) for j, key in out.items())
        return out


class EdgeSecrets:
    """The edge secrets a process knows: ``secret(e)`` for every edge incident to its nodes.

    Secrets never appear in ``repr``/``str`` and the object refuses to be pickled; save them
    explicitly with :meth:`save` (a file whose name ends in ``.secrets.json``) or re-derive them
    with :func:`agree_edge_secrets` from the same (seed, topology, session_id).
    """

    __slots__ = ("_secrets", "edges", "n_nodes", "nodes", "public_keys", "session_id")

    def __init__(
        self,
        *,
        edges: np.ndarray,
        n_nodes: int,
        nodes: Sequence[int],
        secrets: Mapping[int, bytes],
        public_keys: Mapping[int, bytes],
        session_id: bytes,
    ) -> None:
        self.edges = as_edge_array(edges, n_nodes)
        self.n_nodes = n_nodes
        self.nodes = tuple(int(i) for i in nodes)
        self._secrets = dict(secrets)
        self.public_keys = dict(public_keys)
        self.session_id = session_id

    def __repr__(self) -> str:
        return (
            f"EdgeSecrets(n_nodes={self.n_nodes}, edges={len(self.edges)}, "
            f"known={len(self._secrets)}, session_id={self.session_id!r}, secrets=<hidden>)"
        )

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError(
            "EdgeSecrets are not picklable; use EdgeSecrets.save (a .secrets.json file)"
        )

    def __deepcopy__(self, memo: dict) -> EdgeSecrets:
        return self  # immutable by convention

    def __len__(self) -> int:
        return len(self._secrets)

    def secret(self, edge_index: int) -> bytes:
        """The 32-byte secret of edge ``edges[edge_index]``; PrivacyError if this process lacks it."""
        try:
            return self._secrets[edge_index]
        except KeyError:
            u, v = self.edges[edge_index].tolist()
            raise PrivacyError(f"edge ({u}, {v}) is not incident to a node owned here") from None

    def edge_keys(self) -> list[bytes | None]:
        """Stream keys aligned with ``edges`` (None for edges not incident to owned nodes)."""
        return [self._secrets.get(e) for e in range(len(self.edges))]

    def save(self, path: str | Path) -> Path:
        """Write the secrets (hex) to ``path``, which must end in ``.secrets.json``; mode 0600."""
        path = Path(path)
        if not path.name.endswith(_SECRET_FILE_SUFFIX):
            raise PrivacyError(f"secret files must be named '*{_SECRET_FILE_SUFFIX}'; got {path}")
        payload = {
            "format": "privdl-edge-secrets/v1",
            "n_nodes": self.n_nodes,
            "edges": self.edges.tolist(),
            "nodes": list(self.nodes),
            "session_id": self.session_id.hex(),
            "public_keys": {str(i): key.hex() for i, key in self.public_keys.items()},
            "secrets": {str(e): s.hex() for e, s in self._secrets.items()},
        }
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
        return path

    @classmethod
    def load(cls, path: str | Path) -> EdgeSecrets:
        """Read a file written by :meth:`save`."""
        try:
            payload = json.loads(Path(path).read_text())
            if payload.get("format") != "privdl-edge-secrets/v1":
                raise ValueError("unknown format")
            return cls(
                edges=np.asarray(payload["edges"], dtype=np.int64).reshape(-1, 2),
                n_nodes=int(payload["n_nodes"]),
                nodes=payload["nodes"],
                secrets={int(e): bytes.fromhex(s) for e, s in payload["secrets"].items()},
                public_keys={int(i): bytes.fromhex(k) for i, k in payload["public_keys"].items()},
                session_id=bytes.fromhex(payload["session_id"]),
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PrivacyError(f"cannot read edge secrets from {path}: {exc}") from None


def agree_edge_secrets(
    edges: Any,
    n_nodes: int,
    *,
    transport: KeyTransport | None = None,
    nodes: Iterable[int] | None = None,
    seed: int | bytes | None = None,
    session_id: bytes | str = b"",
    authenticator: Authenticator | None = None,
    workers: int | None = None,
) -> EdgeSecrets:
    """Run DECOR's one-round secret setup (paper s.2; docs/secrets.md) for the nodes owned here.

    Every owned node makes an X25519 key pair (OS randomness, or derived from ``seed`` -- INSECURE,
    for reproducible simulation only: anyone who knows the seed knows every secret), publishes its
    public key on ``transport`` (default: a fresh :class:`LocalKeyTransport` over all nodes),
    collects its neighbours' keys and derives one HKDF-SHA256 secret per incident edge. When both
    endpoints of an edge are owned here, the edge takes one exchange and the two endpoints' secrets
    are checked to agree (they agree exactly when each received the key the other published).
    Private keys are discarded on return. With ``authenticator`` each published key carries its
    node's Ed25519 signature and every received key is verified against the roster before the
    exchange (:mod:`privdl.mechanisms.identity`); the secrets are the same as without.

    ``workers``: processes sharing the public-key arithmetic (the key pairs and the exchanges,
    split into contiguous blocks of owned nodes; the extra ones forked from this process). None
    picks one per available CPU (shared with the other ranks of a launched run on this machine)
    when the work is at least :data:`PARALLEL_MIN_OPERATIONS`
    scalar multiplications, else 1 (in-process). The secrets are the same for every value.
    """
    array = as_edge_array(edges, n_nodes)
    session = session_id.encode() if isinstance(session_id, str) else bytes(session_id)
    owned = sorted(set(range(n_nodes) if nodes is None else (int(i) for i in nodes)))
    if any(not 0 <= i < n_nodes for i in owned):
        raise GraphError(f"owned nodes must lie in [0, {n_nodes})")
    if transport is None:
        if nodes is not None and len(owned) < n_nodes:
            raise PrivacyError("a process owning a shard of nodes must pass its key transport")
        transport = LocalKeyTransport(array, n_nodes)
    # which edges this process derives, and at which owned endpoint (the lower one when both are)
    is_owned = np.zeros(n_nodes, dtype=bool)
    is_owned[owned] = True
    u_all, v_all = array[:, 0], array[:, 1]
    own_u, own_v = is_owned[u_all], is_owned[v_all]
    mine = np.flatnonzero(own_u | own_v)
    comp = np.where(own_u, u_all, v_all)[mine]
    peer = np.where(own_u, v_all, u_all)[mine]
    local = (own_u & own_v)[mine]
    row = np.searchsorted(np.asarray(owned, dtype=np.int64), comp)  # comp's index in ``owned``
    blocks = _blocks(row, len(owned), _worker_count(workers, len(owned) + len(mine)))
    scalars = _private_scalars(owned, seed, session)
    with _KeyPool(scalars, blocks) as pool:
        public_list = pool.public_keys()
        public = dict(zip(owned, public_list, strict=True))
        for i in owned:
            key = public[i]
            signed = key if authenticator is None else authenticator.sign(i, key, session)
            transport.publish(i, signed)
        received: dict[int, dict[int, bytes]] = {}
        for i in owned:
            got = dict(transport.collect(i))
            if authenticator is not None:  # verified before any exchange
                got = {j: authenticator.open(j, key, session) for j, key in got.items()}
            received[i] = got
        pairs = list(zip(comp.tolist(), peer.tolist(), strict=True))
        try:
            peer_keys = [bytes(received[i][j]) for i, j in pairs]
        except KeyError:
            peer_keys = [_received(received, i, j) for i, j in pairs]  # names the first missing
        # Both endpoints owned here: their two secrets agree exactly when each received the key
        # the other published (X25519 gives both the same shared point, RFC 7748 s.6.1, and HKDF
        # binds the key bytes), so the edge takes one exchange and the keys are compared.
        for k in np.flatnonzero(local).tolist():
            i, j = pairs[k]
            back = received[j].get(i)
            if peer_keys[k] == public[j] and back is not None and bytes(back) == public[i]:
                continue
            for a, b, key in ((i, j, peer_keys[k]), (j, i, _received(received, j, i))):
                if key != public[b]:
                    # an invalid key is reported as such first
                    at = scalars[owned.index(a)]
                    _exchange(X25519PrivateKey.from_private_bytes(at), key, a, b)
                    raise PrivacyError(
                        f"edge ({min(a, b)}, {max(a, b)}): endpoints derived different secrets"
                    )
        derived = pool.edge_secrets(
            row=row,
            u=u_all[mine],
            v=v_all[mine],
            comp=comp,
            peer_keys=peer_keys,
            public=public_list,
            session=session,
        )
    all_public = dict(public)
    order = np.argsort(comp, kind="stable")  # as the nodes are visited, each in edge order
    for k in order[~local[order]].tolist():
        all_public.setdefault(int(peer[k]), peer_keys[k])
    secrets = dict(zip(mine.tolist(), derived, strict=True))
    return EdgeSecrets(
        edges=array,
        n_nodes=n_nodes,
        nodes=owned,
        secrets=secrets,
        public_keys=all_public,
        session_id=session,
    )


#: Below this many scalar multiplications (key pairs + exchanges) ``workers=None`` stays in one
#: process: forking and the pipes would cost more than the arithmetic they share (measured on 2
#: loaded cores: two workers break even at 5,000-10,000; docs/engine.md, "100,000 nodes on a CPU").
PARALLEL_MIN_OPERATIONS = 20_000


def _worker_count(workers: int | None, operations: int) -> int:
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise PrivacyError(f"workers must be a positive int or None; got {workers!r}")
        return workers
    if operations < PARALLEL_MIN_OPERATIONS:
        return 1
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    # the processes of a launched run on this machine share its CPUs (torchrun and privdl launch
    # set LOCAL_WORLD_SIZE)
    local = os.environ.get("LOCAL_WORLD_SIZE", "1")
    return max(1, cpus // max(1, int(local) if local.isdigit() else 1))


def _blocks(row: np.ndarray, n_owned: int, count: int) -> list[tuple[int, int]]:
    """``count`` contiguous blocks of owned-node rows, each about the same number of scalar
    multiplications (one per key pair, one per edge derived at that node)."""
    if count == 1 or n_owned < 2:
        return [(0, n_owned)]
    cost = 1 + np.bincount(row, minlength=n_owned)
    cuts = np.searchsorted(np.cumsum(cost), np.arange(1, count) * cost.sum() / count)
    bounds = [0, *sorted(set(np.clip(cuts, 1, n_owned - 1).tolist())), n_owned]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=False) if b > a]


def _received(received: Mapping[int, Mapping[int, bytes]], i: int, j: int) -> bytes:
    try:
        return bytes(received[i][j])
    except KeyError:
        raise PrivacyError(f"node {i}: no public key received from neighbour {j}") from None


def _private_scalars(
    nodes: Sequence[int], seed: int | bytes | None, session_id: bytes
) -> list[bytes]:
    """The nodes' 32-byte X25519 private keys (RFC 7748 s.5: clamped on use): OS randomness by
    default; with ``seed`` derived from it (INSECURE, simulation only). ``_hkdf(seed, info)``
    per node, its extract step (the same for every node) made once."""
    if seed is None:
        return [os.urandom(32) for _ in nodes]
    prk = hmac.digest(_HKDF_ZERO_SALT, _seed_bytes(seed), "sha256")
    head, tail = _NODE_KEY_LABEL + b"|node|", b"|session|" + session_id + b"\x01"
    return [hmac.digest(prk, head + _node_id(i) + tail, "sha256") for i in nodes]


class _KeyBlock:
    """The key pairs of a block of owned nodes and the exchanges derived at them; runs in this
    process or in a forked worker (the same code, so the same bytes)."""

    def __init__(self, scalars: Sequence[bytes]) -> None:
        self.keys = [X25519PrivateKey.from_private_bytes(s) for s in scalars]

    def public_keys(self) -> bytes:
        return b"".join(key.public_key().public_bytes_raw() for key in self.keys)

    def edge_secrets(self, task: tuple[Any, ...]) -> bytes:
        session, rows, us, vs, comps, peer_keys, own_keys = task
        cache: dict[bytes, X25519PublicKey] = {}
        out = []
        keys, digest, pack, salt = self.keys, hmac.digest, _EDGE_IDS.pack, _HKDF_ZERO_SALT
        head, tail = EDGE_SECRET_LABEL + b"|edge|", b"|session|" + session + b"\x01"
        for r, u, v, i, key_j, key_i in zip(rows, us, vs, comps, peer_keys, own_keys, strict=True):
            peer_key = cache.get(key_j)
            if peer_key is None:
                peer_key = cache[key_j] = X25519PublicKey.from_public_bytes(key_j)
            try:
                shared = keys[r].exchange(peer_key)
            except ValueError as exc:
                j = v if i == u else u
                raise PrivacyError(f"node {i}: invalid public key from node {j}: {exc}") from None
            keys_uv = key_i + key_j if i == u else key_j + key_i
            # _hkdf(shared, edge_info(u, v, key_u, key_v, session)), written out
            prk = digest(salt, shared, "sha256")
            out.append(digest(prk, head + pack(u, v) + b"|keys|" + keys_uv + tail, "sha256"))
        return b"".join(out)


def _serve_block(conn: Any, scalars: Sequence[bytes]) -> None:
    """A forked worker: its block's public keys, then the secrets of the edges sent to it."""
    try:
        block = _KeyBlock(scalars)
        conn.send(("ok", block.public_keys()))
        task = conn.recv()
        conn.send(("ok", block.edge_secrets(task)))
    except PrivacyError as exc:
        conn.send(("error", str(exc)))
    except (EOFError, OSError):
        pass
    finally:
        conn.close()


class _KeyPool:
    """Block 0 in this process, the others in forked workers (``fork``: they inherit the private
    scalars, which never cross a pipe; only public keys and derived edge secrets come back)."""

    def __init__(self, scalars: list[bytes], blocks: list[tuple[int, int]]) -> None:
        self.scalars, self.blocks = scalars, blocks
        self.workers: list[tuple[Any, Any]] = []

    def __enter__(self) -> _KeyPool:
        import multiprocessing

        context = multiprocessing.get_context("fork")
        for a, b in self.blocks[1:]:
            mine, theirs = context.Pipe()
            proc = context.Process(
                target=_serve_block, args=(theirs, self.scalars[a:b]), daemon=True
            )
            proc.start()
            theirs.close()
            self.workers.append((proc, mine))
        a, b = self.blocks[0]
        self.first = _KeyBlock(self.scalars[a:b])
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        for proc, conn in self.workers:
            conn.close()
            if kind is not None:  # a refusal before the workers' last task: stop them
                proc.terminate()
            proc.join()

    def _reply(self, conn: Any) -> bytes:
        try:
            status, payload = conn.recv()
        except EOFError:
            raise PrivacyError("a key-agreement worker process died") from None
        if status != "ok":
            raise PrivacyError(payload)
        return payload

    def public_keys(self) -> list[bytes]:
        blob = self.first.public_keys() + b"".join(self._reply(c) for _, c in self.workers)
        return [blob[k : k + 32] for k in range(0, len(blob), 32)]

    def edge_secrets(
        self,
        *,
        row: np.ndarray,
        u: np.ndarray,
        v: np.ndarray,
        comp: np.ndarray,
        peer_keys: list[bytes],
        public: list[bytes],
        session: bytes,
    ) -> list[bytes]:
        order = np.argsort(row, kind="stable")
        starts = np.searchsorted(row[order], [a for a, _ in self.blocks])
        stops = np.searchsorted(row[order], [b for _, b in self.blocks])
        tasks = []
        for (a, _), lo, hi in zip(self.blocks, starts.tolist(), stops.tolist(), strict=True):
            pick = order[lo:hi]
            rows = row[pick].tolist()
            tasks.append(
                (
                    session,
                    [r - a for r in rows],
                    u[pick].tolist(),
                    v[pick].tolist(),
                    comp[pick].tolist(),
                    [peer_keys[k] for k in pick.tolist()],
                    [public[r] for r in rows],
                )
            )
        for (_, conn), task in zip(self.workers, tasks[1:], strict=True):
            conn.send(task)
        blob = self.first.edge_secrets(tasks[0])
        blob += b"".join(self._reply(c) for _, c in self.workers)
        flat = [blob[k : k + 32] for k in range(0, len(blob), 32)]
        out: list[bytes] = [b""] * len(flat)
        for k, e in enumerate(order.tolist()):
            out[e] = flat[k]
        return out


def _exchange(private: X25519PrivateKey, public_bytes: bytes, i: int, j: int) -> bytes:
    """X25519 of node ``i``'s private key with the key received from ``j``."""
    try:
        return private.exchange(X25519PublicKey.from_public_bytes(public_bytes))
    except ValueError as exc:
        raise PrivacyError(f"node {i}: invalid public key from node {j}: {exc}") from None


def node_noise_keys(
    nodes: Iterable[int], *, seed: int | bytes | None = None, session_id: bytes | str = b""
) -> list[bytes]:
    """Private 32-byte stream keys for each node's independent noise vbar_i (Alg 1 line 3).

    Without ``seed``: OS randomness. With ``seed``: HKDF of the seed and the node id (INSECURE,
    reproducible simulation only), so a node's key does not depend on which process owns it.
    """
    session = session_id.encode() if isinstance(session_id, str) else bytes(session_id)
    if seed is None:
        return [os.urandom(32) for _ in nodes]
    base = _seed_bytes(seed)
    return [
        _hkdf(base, _NODE_NOISE_LABEL + b"|node|" + _node_id(i) + b"|session|" + session)
        for i in nodes
    ]
