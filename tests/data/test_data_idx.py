"""IDX reader, SHA-256 verification, lookup order and (injected, offline) download."""

from __future__ import annotations

import gzip
import hashlib
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from privdl.data import idx as I
from privdl.data import load_dataset
from privdl.errors import DataError


def _idx_bytes(arr: np.ndarray, type_code: int = 0x08) -> bytes:
    """Independent IDX writer: 0x0000, type, ndim, big-endian uint32 dims, big-endian data."""
    header = struct.pack(">HBB", 0, type_code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def _fake_mnist(seed: int) -> dict[str, bytes]:
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": _idx_bytes(rng.integers(0, 256, (6, 28, 28), dtype=np.uint8)),
        "train-labels-idx1-ubyte": _idx_bytes(rng.integers(0, 10, 6, dtype=np.uint8)),
        "t10k-images-idx3-ubyte": _idx_bytes(rng.integers(0, 256, (4, 28, 28), dtype=np.uint8)),
        "t10k-labels-idx1-ubyte": _idx_bytes(rng.integers(0, 10, 4, dtype=np.uint8)),
    }


def _write(files: dict[str, bytes], folder: Path, *, gz: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        if gz:
            (folder / (name + ".gz")).write_bytes(gzip.compress(data))
        else:
            (folder / name).write_bytes(data)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Tiny MNIST-shaped files whose hashes replace the canonical ones for this test."""
    files = _fake_mnist(0)
    monkeypatch.setitem(
        I.IDX_SHA256, "mnist", {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
    )
    return files


@pytest.mark.parametrize(
    ("dtype", "code"),
    [(np.uint8, 0x08), (np.int8, 0x09), (np.int16, 0x0B), (np.int32, 0x0C), (np.float32, 0x0D)],
)
def test_parse_idx_roundtrip(dtype: type, code: int) -> None:
    arr = (np.arange(2 * 3 * 5) - 7).astype(dtype).reshape(2, 3, 5)
    if dtype == np.uint8:
        arr = np.arange(30, dtype=np.uint8).reshape(2, 3, 5)
    np.testing.assert_array_equal(I.parse_idx(_idx_bytes(arr, code)), arr)


def test_parse_idx_rejects_bad_files() -> None:
    good = _idx_bytes(np.zeros((3, 2), dtype=np.uint8))
    with pytest.raises(DataError, match="magic"):
        I.parse_idx(b"\x01" + good[1:])
    with pytest.raises(DataError, match="type code"):
        I.parse_idx(good[:2] + b"\x07" + good[3:])
    with pytest.raises(DataError, match="payload"):
        I.parse_idx(good[:-1])


def test_read_idx_gz_and_plain(tmp_path: Path) -> None:
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    (tmp_path / "a").write_bytes(_idx_bytes(arr))
    (tmp_path / "a.gz").write_bytes(gzip.compress(_idx_bytes(arr)))
    np.testing.assert_array_equal(I.read_idx(tmp_path / "a"), arr)
    np.testing.assert_array_equal(I.read_idx(tmp_path / "a.gz"), arr)
    (tmp_path / "b.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read"):
        I.read_idx(tmp_path / "b.gz")


@pytest.mark.parametrize("layout", ["sub-gz", "flat-plain"])
def test_load_from_data_dir(tmp_path: Path, fake: dict[str, bytes], layout: str) -> None:
    folder = tmp_path / "mnist" if layout == "sub-gz" else tmp_path
    _write(fake, folder, gz=layout == "sub-gz")
    arrays = I.load_idx_arrays("mnist", data_dir=tmp_path, download=False)
    np.testing.assert_array_equal(arrays["y_test"], I.parse_idx(fake["t10k-labels-idx1-ubyte"]))
    assert arrays["x_train"].shape == (6, 28, 28) and arrays["x_train"].dtype == np.uint8


def test_lookup_order_data_dir_then_env_then_cache(
    tmp_path: Path, fake: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "xdg-cache" / "privdl" / "mnist"
    env_dir, arg_dir = tmp_path / "env", tmp_path / "arg"
    _write(fake, cache, gz=True)
    want = I.parse_idx(fake["train-labels-idx1-ubyte"])
    assert (I.load_idx_arrays("mnist", download=False)["y_train"] == want).all()
    # env dir holds a corrupted copy: it is looked at before the cache, so it must be rejected
    bad = dict(fake)
    bad["train-labels-idx1-ubyte"] = fake["train-labels-idx1-ubyte"][:-1] + b"\x09"
    _write(bad, env_dir / "mnist", gz=False)
    monkeypatch.setenv("PRIVDL_DATA_DIR", str(env_dir))
    with pytest.raises(DataError, match="SHA-256"):
        I.load_idx_arrays("mnist", download=False)
    # an explicit data_dir wins over both
    _write(fake, arg_dir, gz=False)
    assert (I.load_idx_arrays("mnist", data_dir=arg_dir, download=False)["y_train"] == want).all()


def test_missing_files_error_names_files_places_and_remedy(tmp_path: Path) -> None:
    calls: list[str] = []

    def fetch(url: str, timeout: float) -> bytes:
        calls.append(url)
        raise OSError("no network")

    with pytest.raises(DataError) as err:
        I.load_idx_arrays("fashion-mnist", data_dir=tmp_path, download=False, fetch=fetch)
    msg = str(err.value)
    assert "\n" not in msg
    for needle in (
        "t10k-labels-idx1-ubyte",
        str(tmp_path),
        "xdg-cache",
        "--data-dir",
        "PRIVDL_DATA_DIR",
    ):
        assert needle in msg
    assert calls == []  # download=False never calls the fetcher


def test_offline_env_blocks_download(tmp_path: Path) -> None:
    calls: list[str] = []
    with pytest.raises(DataError, match="download disabled"):
        I.load_idx_arrays("mnist", data_dir=tmp_path, fetch=lambda u, t: calls.append(u) or b"")
    assert calls == []


def test_injected_download_verifies_and_caches(
    tmp_path: Path, fake: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PRIVDL_OFFLINE")
    seen: list[tuple[str, float]] = []

    def fetch(url: str, timeout: float) -> bytes:
        seen.append((url, timeout))
        return gzip.compress(fake[url.rsplit("/", 1)[1].removesuffix(".gz")])

    arrays = I.load_idx_arrays("mnist", data_dir=tmp_path / "empty", fetch=fetch)
    assert len(seen) == 4 and all(t <= 10 for _, t in seen)
    assert seen[0][0].startswith(I.MIRRORS["mnist"][0])
    np.testing.assert_array_equal(arrays["x_test"], I.parse_idx(fake["t10k-images-idx3-ubyte"]))
    cached = tmp_path / "xdg-cache" / "privdl" / "mnist" / "t10k-images-idx3-ubyte.gz"
    assert gzip.decompress(cached.read_bytes()) == fake["t10k-images-idx3-ubyte"]


def test_injected_download_with_wrong_bytes_is_refused(
    tmp_path: Path, fake: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PRIVDL_OFFLINE")
    with pytest.raises(DataError, match="download failed"):
        I.load_idx_arrays(
            "mnist", data_dir=tmp_path, fetch=lambda u, t: gzip.compress(b"\0\0\x08\x01junk")
        )
    assert not (tmp_path / "xdg-cache" / "privdl" / "mnist").exists()


def test_real_mnist_from_shared(shared_dataset_dir: Callable[[str], Path]) -> None:
    root = shared_dataset_dir("mnist").parent
    ds = load_dataset("mnist", data_dir=root, download=False)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    # LeCun's published training label counts
    counts = np.bincount(ds.y_train.numpy(), minlength=10)
    assert counts.tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    # 0.1307 / 0.3081 are MNIST's training pixel mean / std: normalised data is ~N(0, 1)
    assert abs(float(ds.x_train.mean())) < 1e-3 and abs(float(ds.x_train.std()) - 1) < 1e-3
    unit = ds.x_test * 0.3081 + 0.1307  # undo Normalize: pixels/255 span exactly [0, 1]
    assert abs(float(unit.min())) < 1e-6 and abs(float(unit.max()) - 1) < 1e-6


def test_real_fashion_mnist_from_shared(shared_dataset_dir: Callable[[str], Path]) -> None:
    root = shared_dataset_dir("fashion-mnist").parent
    arrays = I.load_idx_arrays("fashion-mnist", data_dir=root, download=False)
    assert np.bincount(arrays["y_train"]).tolist() == [6000] * 10
    assert np.bincount(arrays["y_test"]).tolist() == [1000] * 10


def test_real_corrupted_mnist_file_is_rejected(
    tmp_path: Path, shared_dataset_dir: Callable[[str], Path]
) -> None:
    src = shared_dataset_dir("mnist")
    dst = tmp_path / "mnist"
    dst.mkdir()
    for f in src.iterdir():
        shutil.copyfile(f, dst / f.name)
    labels = bytearray(gzip.decompress((dst / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    labels[100] = (labels[100] + 1) % 10  # still a well-formed IDX file, different content
    (dst / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(labels)))
    with pytest.raises(DataError, match="t10k-labels.*SHA-256"):
        I.load_idx_arrays("mnist", data_dir=tmp_path, download=False)


@pytest.mark.parametrize("mode", ["paper", "unit", "none"])
def test_load_dataset_normalisation_modes(
    tmp_path: Path, fake: dict[str, bytes], mode: str
) -> None:
    _write(fake, tmp_path / "mnist", gz=True)
    ds = load_dataset("mnist", data_dir=tmp_path, download=False, normalize=mode)
    raw = I.parse_idx(fake["train-images-idx3-ubyte"]).astype(np.float64)[:, None]
    expected = {"none": raw, "unit": raw / 255, "paper": (raw / 255 - 0.1307) / 0.3081}[mode]
    assert ds.x_train.shape == (6, 1, 28, 28) and ds.x_train.dtype == torch.float32
    np.testing.assert_allclose(ds.x_train.numpy(), expected, rtol=1e-6, atol=1e-6)
    assert ds.y_train.dtype == torch.int64


def test_parse_idx_rejects_trailing_bytes() -> None:
    """A payload longer than the header's dims is as corrupt as a short one."""
    good = _idx_bytes(np.zeros((3, 2), dtype=np.uint8))
    with pytest.raises(DataError, match="payload"):
        I.parse_idx(good + b"\x00")


@pytest.mark.parametrize(("value", "expected"), [("1", True), ("true", True), ("YES", True),
                                                 (" on ", True), ("0", False), ("", False),
                                                 ("no", False)])  # fmt: skip
def test_offline_values(monkeypatch, value, expected) -> None:
    from privdl.data._files import ENV_OFFLINE, offline

    monkeypatch.setenv(ENV_OFFLINE, value)
    assert offline() is expected
