"""X25519 + HKDF edge secrets: endpoint agreement, documented derivation, nothing secret on the wire."""

from __future__ import annotations

import copy
import os
import pickle
import stat
import threading
from collections.abc import Mapping

import networkx as nx
import numpy as np
import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from privdl.errors import GraphError, PrivacyError
from privdl.mechanisms.secrets import (
    EdgeSecrets,
    LocalKeyTransport,
    agree_edge_secrets,
    node_noise_keys,
)


def _edges(graph: nx.Graph) -> np.ndarray:
    return np.array(sorted(tuple(sorted(e)) for e in graph.edges()), dtype=np.int64)


TORUS = _edges(nx.convert_node_labels_to_integers(nx.grid_2d_graph(4, 4, periodic=True)))
RING = _edges(nx.cycle_graph(16))


class ThreadedTransport:
    """A blocking public-key board shared by several 'processes' (threads), like a real network."""

    def __init__(self, edges: np.ndarray, n_nodes: int) -> None:
        self.neighbours = {i: sorted(nx.Graph(edges.tolist()).neighbors(i)) for i in range(n_nodes)}
        self.board: dict[int, bytes] = {}
        self.cond = threading.Condition()
        self.wire: list[bytes] = []

    def publish(self, node: int, public_bytes: bytes) -> None:
        with self.cond:
            self.board[node] = public_bytes
            self.wire.append(public_bytes)
            self.cond.notify_all()

    def collect(self, node: int) -> Mapping[int, bytes]:
        with self.cond:
            ok = self.cond.wait_for(lambda: all(j in self.board for j in self.neighbours[node]), 10)
            assert ok, "neighbour never published"
            return {j: self.board[j] for j in self.neighbours[node]}


def _run_sharded(edges: np.ndarray, n: int, shards: list[list[int]], **kwargs) -> list[EdgeSecrets]:
    transport = ThreadedTransport(edges, n)
    results: list[EdgeSecrets | None] = [None] * len(shards)

    def work(k: int) -> None:
        results[k] = agree_edge_secrets(edges, n, transport=transport, nodes=shards[k], **kwargs)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(len(shards))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def test_endpoints_in_different_processes_derive_the_same_secret() -> None:
    # OS randomness (no seed): the only thing the two shards share is the transport.
    shards = [list(range(8)), list(range(8, 16))]
    left, right = _run_sharded(TORUS, 16, shards)
    cut = [e for e, (u, v) in enumerate(TORUS.tolist()) if (u < 8) != (v < 8)]
    assert cut
    for e in cut:
        assert left.secret(e) == right.secret(e)
    with pytest.raises(PrivacyError):
        left.secret(next(e for e, (u, v) in enumerate(TORUS.tolist()) if u >= 8 and v >= 8))


def test_secret_follows_documented_x25519_hkdf_derivation() -> None:
    # Oracle written from docs/secrets.md with the cryptography primitives directly.
    seed, session = 2024, b"run-7"

    def private(node: int) -> X25519PrivateKey:
        info = b"privdl/insecure-simulation/x25519-private-key/v1|node|"
        info += node.to_bytes(8, "big") + b"|session|" + session
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info)
        return X25519PrivateKey.from_private_bytes(hkdf.derive(b"2024"))

    secrets = agree_edge_secrets(RING, 16, seed=seed, session_id=session)
    for e, (u, v) in enumerate(RING.tolist()):
        sk_u, sk_v = private(u), private(v)
        pk_u = sk_u.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        pk_v = sk_v.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        shared = sk_v.exchange(X25519PublicKey.from_public_bytes(pk_u))
        info = b"privdl/decor/edge-secret/v1|edge|" + u.to_bytes(8, "big") + v.to_bytes(8, "big")
        info += b"|keys|" + pk_u + pk_v + b"|session|" + session
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info)
        assert secrets.secret(e) == hkdf.derive(shared)


def test_seeded_secrets_reproduce_and_depend_on_seed_and_session() -> None:
    a = agree_edge_secrets(RING, 16, seed=1, session_id="s")
    b = agree_edge_secrets(RING, 16, seed=1, session_id="s")
    c = agree_edge_secrets(RING, 16, seed=2, session_id="s")
    d = agree_edge_secrets(RING, 16, seed=1, session_id="t")
    assert a.edge_keys() == b.edge_keys()
    keys = {k for s in (a, c, d) for k in s.edge_keys()}
    assert len(keys) == 3 * len(RING)  # all distinct across seeds, sessions and edges


def test_seeded_sharded_run_equals_single_process_run() -> None:
    whole = agree_edge_secrets(TORUS, 16, seed=5, session_id="x")
    parts = _run_sharded(
        TORUS,
        16,
        [[0, 5, 10, 15], [1, 2, 3, 4, 6, 7, 8, 9, 11, 12, 13, 14]],
        seed=5,
        session_id="x",
    )
    for e in range(len(TORUS)):
        owners = [p for p in parts if set(TORUS[e].tolist()) & set(p.nodes)]
        assert all(p.secret(e) == whole.secret(e) for p in owners)


def test_default_keys_come_from_os_randomness() -> None:
    assert agree_edge_secrets(RING, 16).edge_keys() != agree_edge_secrets(RING, 16).edge_keys()


def test_transport_carries_only_public_keys() -> None:
    transport = LocalKeyTransport(TORUS, 16)
    secrets = agree_edge_secrets(TORUS, 16, transport=transport, seed=3, session_id="wire")
    wire = b"".join(payload for _, _, _, payload in transport.carried)
    assert {payload for _, _, _, payload in transport.carried} == set(secrets.public_keys.values())
    assert all(len(payload) == 32 for _, _, _, payload in transport.carried)
    for key in secrets.edge_keys():
        assert key is not None and key not in wire
    # the (seed-derived) private keys are not on the wire either
    for node in range(16):
        info = b"privdl/insecure-simulation/x25519-private-key/v1|node|"
        info += node.to_bytes(8, "big") + b"|session|wire"
        private = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(b"3")
        assert private not in wire


def test_transport_delivers_each_node_exactly_its_neighbours_keys() -> None:
    transport = LocalKeyTransport(RING, 16)
    secrets = agree_edge_secrets(RING, 16, transport=transport, seed=4, session_id="sets")
    delivered: dict[int, dict[int, bytes]] = {}
    for kind, src, dst, payload in transport.carried:
        if kind == "deliver":
            assert src not in delivered.setdefault(dst, {})  # once per (neighbour, node)
            delivered[dst][src] = payload
    for i in range(16):  # on ring:16, node i's neighbours are i - 1 and i + 1 (mod 16)
        expected = {j % 16: secrets.public_keys[j % 16] for j in (i - 1, i + 1)}
        assert delivered[i] == expected


def test_repr_and_pickle_never_reveal_secrets(tmp_path) -> None:
    secrets = agree_edge_secrets(RING, 16, seed=9)
    text = repr(secrets) + str(secrets)
    for key in secrets.edge_keys():
        assert key.hex() not in text and repr(key) not in text
    with pytest.raises(TypeError):
        pickle.dumps(secrets)
    assert copy.deepcopy(secrets) is secrets


def test_save_and_load_roundtrip_with_private_file(tmp_path) -> None:
    secrets = agree_edge_secrets(TORUS, 16, seed=4, session_id="ck")
    with pytest.raises(PrivacyError):
        secrets.save(tmp_path / "edges.json")
    path = secrets.save(tmp_path / "run.secrets.json")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = EdgeSecrets.load(path)
    assert loaded.edge_keys() == secrets.edge_keys()
    assert loaded.session_id == b"ck" and np.array_equal(loaded.edges, TORUS)
    (tmp_path / "bad.secrets.json").write_text("{not json")
    with pytest.raises(PrivacyError):
        EdgeSecrets.load(tmp_path / "bad.secrets.json")


class TamperingTransport(LocalKeyTransport):
    """Replaces the key delivered to node 0 from node 1 (an active man in the middle)."""

    def collect(self, node: int) -> dict[int, bytes]:
        out = super().collect(node)
        if node == 0:
            out[1] = (
                X25519PrivateKey.generate()
                .public_key()
                .public_bytes(Encoding.Raw, PublicFormat.Raw)
            )
        return out


def test_endpoint_disagreement_is_detected_in_process() -> None:
    with pytest.raises(PrivacyError, match="different secrets"):
        agree_edge_secrets(RING, 16, transport=TamperingTransport(RING, 16))


def test_invalid_public_key_is_a_privacy_error() -> None:
    class ZeroKeyTransport(LocalKeyTransport):
        def collect(self, node: int) -> dict[int, bytes]:
            return {j: bytes(32) for j in super().collect(node)}  # small-order point

    with pytest.raises(PrivacyError, match="invalid public key"):
        agree_edge_secrets(RING, 16, transport=ZeroKeyTransport(RING, 16))


@pytest.mark.parametrize(
    "edges", [[[1, 0]], [[0, 0]], [[0, 16]], [[0, 1], [0, 1]], [[0, 1, 2]], [[-1, 2]]]
)
def test_bad_edges_raise_graph_error(edges: list[list[int]]) -> None:
    with pytest.raises(GraphError):
        agree_edge_secrets(edges, 16)


def test_shard_without_transport_is_refused() -> None:
    with pytest.raises(PrivacyError):
        agree_edge_secrets(RING, 16, nodes=[0, 1])


def test_node_noise_keys_depend_only_on_seed_session_and_node() -> None:
    full = node_noise_keys(range(16), seed=11, session_id="r")
    part = node_noise_keys([7, 3], seed=11, session_id="r")
    assert part == [full[7], full[3]]
    assert len(set(full)) == 16 and all(len(k) == 32 for k in full)
    assert node_noise_keys([0], seed=11, session_id="q") != full[:1]
    assert node_noise_keys([0]) != node_noise_keys([0])


def test_disagreement_seen_only_at_the_second_endpoint_is_detected() -> None:
    # node 1 (the second endpoint of edge (0, 1) to be visited) receives a forged key for node 0:
    # the edge's one exchange was made at node 0 with the right keys, so only the comparison of
    # node 1's received key with node 0's published one can catch it
    class LateTampering(LocalKeyTransport):
        def collect(self, node: int) -> dict[int, bytes]:
            out = dict(super().collect(node))
            if node == 1:
                forged = X25519PrivateKey.generate().public_key()
                out[0] = forged.public_bytes(Encoding.Raw, PublicFormat.Raw)
            return out

    with pytest.raises(PrivacyError, match="different secrets"):
        agree_edge_secrets(RING, 16, transport=LateTampering(RING, 16))


def test_worker_processes_derive_the_same_secrets_as_one_process() -> None:
    # the forked workers (forced on a small graph) against the in-process path, and both against
    # the documented derivation through the public keys each endpoint published
    edges = _edges(nx.random_regular_graph(3, 40, seed=5))
    serial = agree_edge_secrets(edges, 40, seed=9, session_id="w", workers=1)
    for workers in (2, 3):
        pooled = agree_edge_secrets(edges, 40, seed=9, session_id="w", workers=workers)
        assert pooled.edge_keys() == serial.edge_keys()
        assert pooled.public_keys == serial.public_keys
    assert len(set(serial.edge_keys())) == len(edges)
    shard = agree_edge_secrets(
        edges, 40, transport=_FullBoard(edges, 40, seed=9), nodes=range(20), seed=9,
        session_id="w", workers=2,
    )  # fmt: skip
    for e, (u, v) in enumerate(edges.tolist()):
        if u < 20 or v < 20:
            assert shard.secret(e) == serial.secret(e)


class _FullBoard(LocalKeyTransport):
    """Every node's seeded public key already on the board (the other shard's included)."""

    def __init__(self, edges: np.ndarray, n_nodes: int, *, seed: int) -> None:
        super().__init__(edges, n_nodes)
        full = agree_edge_secrets(edges, n_nodes, seed=seed, session_id="w", workers=1)
        self._board.update(full.public_keys)


def test_worker_processes_report_an_invalid_key_and_a_tampered_one() -> None:
    class ZeroKeyTransport(_FullBoard):
        def collect(self, node: int) -> dict[int, bytes]:
            out = dict(super().collect(node))
            if node == 30:
                out[31] = bytes(32)  # small-order point, from a node of the other shard
            return out

    ring = _edges(nx.cycle_graph(40))
    with pytest.raises(PrivacyError, match="node 30: invalid public key from node 31"):
        agree_edge_secrets(
            ring, 40, transport=ZeroKeyTransport(ring, 40, seed=9), nodes=range(31), seed=9,
            session_id="w", workers=2,
        )  # fmt: skip
    with pytest.raises(PrivacyError, match="different secrets"):
        agree_edge_secrets(RING, 16, transport=TamperingTransport(RING, 16), workers=2)


def test_worker_count_follows_the_work_the_cpus_and_the_ranks_sharing_them(monkeypatch) -> None:
    from privdl.mechanisms.secrets import PARALLEL_MIN_OPERATIONS, _worker_count

    cpus = len(os.sched_getaffinity(0))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert _worker_count(None, PARALLEL_MIN_OPERATIONS - 1) == 1
    assert _worker_count(None, PARALLEL_MIN_OPERATIONS) == cpus
    assert _worker_count(3, 10) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(2 * cpus))  # more ranks here than CPUs
    assert _worker_count(None, 10**6) == 1
    for bad in (0, -1, True, 1.5):
        with pytest.raises(PrivacyError, match="workers"):
            _worker_count(bad, 10)  # type: ignore[arg-type]


def test_more_workers_than_owned_nodes_still_cover_every_edge() -> None:
    one_edge = np.array([[0, 1]], dtype=np.int64)
    single = agree_edge_secrets(one_edge, 2, seed=3, workers=1)
    assert agree_edge_secrets(one_edge, 2, seed=3, workers=5).edge_keys() == single.edge_keys()
    assert len(agree_edge_secrets(np.zeros((0, 2), np.int64), 3, seed=3, workers=4)) == 0
