"""Authenticated key agreement between processes: a rank that swaps a key is refused.

Two gloo ranks own nodes {0, 1} and {2, 3} of ring:4. Honest: both derive, over
``DistributedKeyTransport`` with signed 96-byte records, exactly the edge secrets of the
unauthenticated simulator (oracle: ``agree_edge_secrets`` in one process). Attack: rank 1 sits
in the middle and publishes, for its nodes, X25519 keys of its choosing signed with an identity
that is not theirs in the roster; rank 0 refuses the agreement with a one-line error
(docs/security.md s.3).
"""

from __future__ import annotations

from pathlib import Path

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from privdl.errors import PrivacyError
from privdl.mechanisms.identity import Authenticator, Roster, signed_message
from privdl.mechanisms.secrets import agree_edge_secrets
from privdl.topology import parse_graph

EDGES = parse_graph("ring:4").edges


def _rank(rank: int, out: str, attack: bool) -> None:
    from privdl.comm.distributed import DistributedCommunicator, init_from_env
    from privdl.topology import mixing_matrix

    init_from_env(timeout_s=30)
    comm = DistributedCommunicator(mixing_matrix(parse_graph("ring:4"), "metropolis"))
    auth = Authenticator.from_seed(4, 4, comm.owned_list)
    if attack and rank == 1:
        thief = Ed25519PrivateKey.generate()

        class _Forger(Authenticator):
            def sign(self, node: int, public: bytes, session_id: bytes) -> bytes:
                return public + thief.sign(signed_message(node, public, session_id))

        auth = _Forger(Roster(auth.roster.keys), auth.identities)
    transport = comm.key_transport(EDGES, record_bytes=96)
    try:
        mine = agree_edge_secrets(
            EDGES, 4, transport=transport, nodes=comm.owned_list, seed=8, authenticator=auth
        )
        result: object = mine.edge_keys()
    except PrivacyError as exc:
        result = str(exc)
    torch.save({"result": result, "carried": transport.carried}, Path(out) / f"rank{rank}.pt")


def test_signed_keys_between_ranks_and_a_swapped_key_is_refused(tmp_path, run_ranks):
    honest, attacked = tmp_path / "honest", tmp_path / "attacked"
    honest.mkdir()
    attacked.mkdir()
    assert run_ranks(2, _rank, (str(honest), False)) == [0, 0]
    oracle = agree_edge_secrets(EDGES, 4, seed=8).edge_keys()
    for r in (0, 1):
        got = torch.load(honest / f"rank{r}.pt", weights_only=False)
        assert all(k is None or k == o for k, o in zip(got["result"], oracle, strict=True))
        assert {len(p) for *_, p in got["carried"]} == {2 * 96}  # two boundary nodes, signed
    assert run_ranks(2, _rank, (str(attacked), True)) == [0, 0]
    refused = torch.load(attacked / "rank0.pt", weights_only=False)["result"]
    assert isinstance(refused, str) and "\n" not in refused
    # rank 1 forged both its nodes' keys: node 0 checks its neighbour 3 first
    assert "key received for node 3 is not signed by node 3's identity in the roster" in refused
