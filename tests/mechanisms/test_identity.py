"""Authenticated key agreement: Ed25519 identities, a roster, signed X25519 keys.

The man in the middle (issue 29, item 3; docs/security.md s.3): a transport that replaces node 1's
published X25519 key with its own. Control: without a roster it agrees node 0's edge secret
(computed here from X25519 and HKDF, as docs/secrets.md defines it) -- the attack works. With a
roster the substituted key is refused with a one-line error naming the node, whether the attacker
signs with its own identity, replays node 1's signature over another key, or sends no signature.
An honest authenticated run derives exactly the secrets (and so the numbers) of the
unauthenticated one.
"""

from __future__ import annotations

import json
import os
import pickle
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from privdl.errors import PrivacyError
from privdl.mechanisms.identity import (
    Authenticator,
    Roster,
    identity_file,
    load_identities,
    make_identities,
    signed_message,
)
from privdl.mechanisms.secrets import LocalKeyTransport, _hkdf, agree_edge_secrets, edge_info

EDGES = [(0, 1), (1, 2), (2, 3), (0, 3)]
N = 4


def _raw(key) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


class _ManInTheMiddle(LocalKeyTransport):
    """Delivers, in place of node 1's payload, ``forge(attacker_public, node_1_payload)``."""

    def __init__(self, forge) -> None:
        super().__init__(EDGES, N)
        self.attacker = X25519PrivateKey.generate()
        self.forge = forge

    def collect(self, node: int) -> dict[int, bytes]:
        out = super().collect(node)
        if 1 in out:
            out[1] = self.forge(_raw(self.attacker), out[1])
        return out


def test_without_a_roster_the_man_in_the_middle_learns_the_edge_secret():
    mitm = _ManInTheMiddle(lambda fake, _: fake)
    for j in (1, 2, 3):  # the honest parties' keys
        mitm.publish(j, _raw(X25519PrivateKey.generate()))
    mine = agree_edge_secrets(EDGES, N, transport=mitm, nodes=[0])
    pk0 = mine.public_keys[0]
    shared = mitm.attacker.exchange(X25519PublicKey.from_public_bytes(pk0))
    stolen = _hkdf(shared, edge_info(0, 1, pk0, _raw(mitm.attacker), b""))
    assert mine.secret(0) == stolen  # edge (0, 1): the attacker holds node 0's secret


@pytest.mark.parametrize("how", ["own identity", "replayed signature", "no signature"])
def test_a_substituted_key_is_refused_with_a_clear_error(how):
    auth = Authenticator.from_seed(7, N, range(N))
    attacker_id = Ed25519PrivateKey.generate()
    forge = {
        "own identity": lambda fake, _: fake + attacker_id.sign(signed_message(1, fake, b"")),
        "replayed signature": lambda fake, real: fake + real[32:],
        "no signature": lambda fake, _: fake,
    }[how]
    with pytest.raises(PrivacyError) as err:
        agree_edge_secrets(EDGES, N, transport=_ManInTheMiddle(forge), authenticator=auth)
    text = str(err.value)
    assert "\n" not in text
    if how == "no signature":
        assert "node 1 published 32 bytes, not a signed key" in text
    else:
        assert "key received for node 1 is not signed by node 1's identity in the roster" in text
        assert "man in the middle" in text


def test_honest_authenticated_agreement_gives_the_same_secrets():
    plain = agree_edge_secrets(EDGES, N, seed=11)
    auth = Authenticator.from_seed(3, N, range(N))
    signed = agree_edge_secrets(EDGES, N, seed=11, authenticator=auth)
    assert signed.edge_keys() == plain.edge_keys() and len(plain) == len(EDGES)
    transport = LocalKeyTransport(EDGES, N)
    agree_edge_secrets(EDGES, N, transport=transport, authenticator=auth)
    assert {len(p) for kind, *_, p in transport.carried} == {96}  # key || Ed25519 signature


def test_identities_files_and_roster(tmp_path):
    roster = make_identities(N, tmp_path / "ids")
    assert stat.S_IMODE(os.stat(tmp_path / "ids").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(identity_file(tmp_path / "ids", 2)).st_mode) == 0o600
    assert Roster.load(tmp_path / "ids" / "roster.json") == roster
    mine = load_identities(tmp_path / "ids", [1, 2])
    assert set(mine) == {1, 2}
    auth = Authenticator(roster, mine)
    assert "Ed25519PrivateKey" not in repr(auth)
    with pytest.raises(TypeError):
        pickle.dumps(auth)
    other = make_identities(N, tmp_path / "other")
    with pytest.raises(PrivacyError, match="identity key of node 1 does not match"):
        Authenticator(other, mine)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "privdl-roster/v1", "nodes": {"0": "abcd"}}))
    with pytest.raises(PrivacyError, match="cannot read the roster .* 32 bytes"):
        Roster.load(bad)
    with pytest.raises(PrivacyError, match="cannot read the identity key of node 9"):
        load_identities(tmp_path / "ids", [9])


def test_privdl_identities_and_an_authenticated_run_end_to_end(tmp_path, capsys):
    """``privdl identities`` then ``privdl run decor --roster --identities``: the numbers of the
    unauthenticated run for the same seed; bad combinations are one line, exit 2, no run."""
    from privdl.cli.main import main

    ids = tmp_path / "ids"
    assert main(["identities", "--nodes", "6", "--out", str(ids)]) == 0
    assert main(["identities", "--nodes", "6", "--out", str(ids)]) == 2  # never overwritten
    run = ["run", "decor", "--task", "least-squares", "--graph", "ring:6", "--steps", "2",
           "--eval-every", "2", "--sigma", "0.5", "--sigma-cor", "1", "--clip", "1",
           "--clip-mode", "per_sample", "--no-progress"]  # fmt: skip
    auth = ["--roster", str(ids / "roster.json"), "--identities", str(ids)]
    assert main([*run, "--out", str(tmp_path / "plain")]) == 0
    assert main([*run, *auth, "--out", str(tmp_path / "signed")]) == 0
    rows = [
        json.loads((tmp_path / r / "metrics.jsonl").read_text().splitlines()[-1])
        for r in ("plain", "signed")
    ]
    for r in rows:
        r.pop("wall_time"), r.pop("timestamp", None)
    assert rows[0] == rows[1]
    capsys.readouterr()
    for bad, why in (
        (["--identities", str(ids)], "give --roster FILE too"),
        (["--roster", str(ids / "roster.json")], "--identities FOLDER"),
        (["--roster", "seed", "--key-source", "os"], "authenticates nothing"),
        (["--roster", str(tmp_path / "none.json"), "--identities", str(ids)], "cannot read"),
        (["--roster", "seed", "--sigma-cor", "0"], "agrees no keys: drop --roster"),
    ):
        assert main([*run, *bad, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and why in err, err
        assert not (tmp_path / "bad").exists()
