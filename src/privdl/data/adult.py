"""UCI Adult and its a9a encoding (123 binary features), rebuilt from the raw census files.

a9a is the LIBSVM version of Adult used by DECOR (s.6.1, Fig 1b) and PORTER (s.5.1, Fig 2): 32,561
training and 16,281 test rows, 123 binary features (Platt 1998: continuous columns quantile-binned,
categoricals one-hot). LIBSVM's file is not shipped anywhere we can use, so ``load_a9a`` REBUILDS it
from the raw Adult files; it is not LIBSVM's byte-identical file (the quantile bin edges are ours,
see docs/data.md). Rows with a missing value ('?') are kept; the missing group is all zeros.

The raw Adult files (CC BY 4.0, Becker & Kohavi 1996) ship inside the package
(``privdl/resources/adult``) and are the embedded default real dataset.
"""

from __future__ import annotations

import functools
import gzip
import os
from dataclasses import dataclass
from importlib import resources

import numpy as np

from privdl.data._files import find_file, read_bytes, search_dirs, verify_sha256
from privdl.errors import DataError

ADULT_SHA256 = {
    "adult.data": "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    "adult.test": "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
}
ADULT_ROWS = {"adult.data": 32_561, "adult.test": 16_281}

# Column names in file order (adult.names).
COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
)

# Category lists in adult.names order; a9a's one-hot index follows this order.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "workclass": (
        "Private", "Self-emp-not-inc", "Self-emp-inc", "Federal-gov", "Local-gov", "State-gov",
        "Without-pay", "Never-worked",
    ),
    "education": (
        "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc",
        "9th", "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th",
        "Preschool",
    ),
    "marital-status": (
        "Married-civ-spouse", "Divorced", "Never-married", "Separated", "Widowed",
        "Married-spouse-absent", "Married-AF-spouse",
    ),
    "occupation": (
        "Tech-support", "Craft-repair", "Other-service", "Sales", "Exec-managerial",
        "Prof-specialty", "Handlers-cleaners", "Machine-op-inspct", "Adm-clerical",
        "Farming-fishing", "Transport-moving", "Priv-house-serv", "Protective-serv",
        "Armed-Forces",
    ),
    "relationship": (
        "Wife", "Own-child", "Husband", "Not-in-family", "Other-relative", "Unmarried",
    ),
    "race": ("White", "Asian-Pac-Islander", "Amer-Indian-Eskimo", "Other", "Black"),
    "sex": ("Female", "Male"),
    "native-country": (
        "United-States", "Cambodia", "England", "Puerto-Rico", "Canada", "Germany",
        "Outlying-US(Guam-USVI-etc)", "India", "Japan", "Greece", "South", "China", "Cuba",
        "Iran", "Honduras", "Philippines", "Italy", "Poland", "Jamaica", "Vietnam", "Mexico",
        "Portugal", "Ireland", "France", "Dominican-Republic", "Laos", "Ecuador", "Taiwan",
        "Haiti", "Columbia", "Hungary", "Guatemala", "Nicaragua", "Scotland", "Thailand",
        "Yugoslavia", "El-Salvador", "Trinadad&Tobago", "Peru", "Hong", "Holand-Netherlands",
    ),
}  # fmt: skip

MISSING = -1  # category code of a missing value ('?')

QUANTILE_COLUMNS = ("age", "fnlwgt", "education-num", "hours-per-week")
N_QUANTILE_BINS = 5
ZERO_NONZERO_COLUMNS = ("capital-gain", "capital-loss")

# a9a feature groups in column order: (column, width). Widths sum to 123.
A9A_LAYOUT: tuple[tuple[str, int], ...] = tuple(
    (
        col,
        N_QUANTILE_BINS
        if col in QUANTILE_COLUMNS
        else 2
        if col in ZERO_NONZERO_COLUMNS
        else len(CATEGORIES[col]),
    )
    for col in COLUMNS
)
A9A_N_FEATURES = sum(w for _, w in A9A_LAYOUT)
assert A9A_N_FEATURES == 123


@dataclass(frozen=True)
class AdultTable:
    """Raw Adult rows: numeric columns (float64, NaN never occurs), string columns, labels."""

    numeric: dict[str, np.ndarray]
    categorical: dict[str, np.ndarray]  # int64 codes into CATEGORIES[col]; MISSING for '?'
    label: np.ndarray  # int64 in {0, 1}: 1 means income >50K

    def __len__(self) -> int:
        return int(self.label.shape[0])


@dataclass(frozen=True)
class A9a:
    """The a9a rebuild: float32 binary features and labels in both conventions."""

    x_train: np.ndarray  # (32561, 123) float32 in {0, 1}
    y_train: np.ndarray  # (32561,) float32 in {-1, +1}
    x_test: np.ndarray  # (16281, 123) float32
    y_test: np.ndarray  # (16281,) float32 in {-1, +1}
    bin_upper_edges: dict[str, np.ndarray]  # inclusive upper edges of bins 1..4 per column

    @property
    def y01_train(self) -> np.ndarray:
        """Training labels in {0, 1} (1 = >50K), for BCE."""
        return ((self.y_train + 1) / 2).astype(np.float32)

    @property
    def y01_test(self) -> np.ndarray:
        """Test labels in {0, 1}."""
        return ((self.y_test + 1) / 2).astype(np.float32)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_adult(text: str, *, source: str = "adult") -> AdultTable:
    """Parse raw Adult CSV text (adult.data or adult.test format).

    Skips blank lines and adult.test's junk first line (``|1x3 Cross validator``); accepts labels
    with or without the trailing ``.`` of adult.test. Malformed rows raise DataError naming the line.
    """
    linenos, rows = [], []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("|"):
            linenos.append(lineno)
            rows.append(line.split(","))
    if not rows:
        raise DataError(f"{source}: no data rows")
    widths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    bad = np.flatnonzero(widths != len(COLUMNS) + 1)
    if bad.size:
        k = int(bad[0])
        raise DataError(
            f"{source}:{linenos[k]}: expected {len(COLUMNS) + 1} comma-separated fields, "
            f"got {widths[k]}"
        )
    table = np.strings.strip(np.array(rows, dtype=str))

    def fail(mask: np.ndarray, what: str, col: int) -> None:
        k = int(np.flatnonzero(mask)[0])
        raise DataError(f"{source}:{linenos[k]}: {what} {str(table[k, col])!r}")

    label_text = np.strings.rstrip(table[:, -1], ".")
    positive = label_text == ">50K"
    bad_label = ~positive & (label_text != "<=50K")
    if bad_label.any():
        fail(bad_label, "label is not '>50K' or '<=50K':", -1)
    numeric: dict[str, np.ndarray] = {}
    categorical: dict[str, np.ndarray] = {}
    for j, col in enumerate(COLUMNS):
        column = table[:, j]
        if col in CATEGORIES:
            lookup = {cat: k for k, cat in enumerate(CATEGORIES[col])}
            lookup["?"] = MISSING
            codes = np.array([lookup.get(v, -2) for v in column.tolist()], dtype=np.int64)
            if (codes == -2).any():
                fail(codes == -2, f"unknown {col}", j)
            categorical[col] = codes
            continue
        try:
            values = column.astype(np.float64)
        except ValueError:
            ok = np.array([_is_float(v) for v in column.tolist()])
            fail(~ok, f"{col} is not a number:", j)
        if not np.isfinite(values).all():
            fail(~np.isfinite(values), f"{col} is NaN/Inf:", j)
        numeric[col] = values
    return AdultTable(numeric=numeric, categorical=categorical, label=positive.astype(np.int64))


def _read_adult_file(
    filename: str, data_dir: str | os.PathLike[str] | None, *, verify: bool
) -> tuple[bytes, str]:
    """Contents of ``filename``: from data_dir / $PRIVDL_DATA_DIR when present, else embedded."""
    if data_dir is not None or os.environ.get("PRIVDL_DATA_DIR"):
        dirs = search_dirs(data_dir)[:-1]  # no cache: the package itself is the fallback
        path = find_file(dirs, "adult", filename)
        if path is not None:
            data = read_bytes(path)
            if verify:
                verify_sha256(data, ADULT_SHA256[filename], what=str(path))
            return data, str(path)
        if data_dir is not None:
            looked = ", ".join(str(d) for d in dirs)
            raise DataError(
                f"{filename}(.gz) not found in {looked} (as DIR/adult/{filename} or "
                f"DIR/{filename}); omit data_dir to use the copy embedded in privdl"
            )
    resource = resources.files("privdl").joinpath("resources", "adult", filename + ".gz")
    try:
        data = gzip.decompress(resource.read_bytes())
    except (OSError, EOFError) as exc:
        raise DataError(f"embedded Adult file {filename} is unreadable: {exc}") from None
    if verify:
        verify_sha256(data, ADULT_SHA256[filename], what=f"embedded {filename}")
    return data, f"privdl/resources/adult/{filename}.gz"


def load_adult(
    *, data_dir: str | os.PathLike[str] | None = None, verify: bool = True
) -> tuple[AdultTable, AdultTable]:
    """Load the raw UCI Adult train/test tables (32,561 / 16,281 rows).

    Reads ``adult.data`` / ``adult.test`` from ``data_dir`` or ``$PRIVDL_DATA_DIR`` when given
    (``DIR/adult/<file>`` or ``DIR/<file>``, ``.gz`` or plain), otherwise the copy embedded in the
    package. With ``verify`` the SHA-256 of the uncompressed contents must match the UCI files.
    """
    (train, train_where), (test, test_where) = _adult_texts(data_dir, verify=verify)
    return parse_adult(train, source=train_where), parse_adult(test, source=test_where)


def _adult_texts(data_dir: str | os.PathLike[str] | None, *, verify: bool) -> list[tuple[str, str]]:
    """(text, where it came from) of adult.data and adult.test."""
    texts = []
    for filename in ("adult.data", "adult.test"):
        data, where = _read_adult_file(filename, data_dir, verify=verify)
        try:
            texts.append((data.decode("ascii"), where))
        except UnicodeDecodeError:
            raise DataError(f"{where} is not ASCII text (corrupt Adult file?)") from None
    return texts


def quantile_upper_edges(values: np.ndarray, n_bins: int = N_QUANTILE_BINS) -> np.ndarray:
    """Tie-aware quantile bin edges: ``n_bins - 1`` inclusive upper edges, strictly increasing.

    Edge k (k = 1..n_bins-1) is the observed value v whose empirical CDF F(v) = P(X <= v) is
    nearest to k/n_bins, among values above edge k-1 and leaving room for the remaining edges.
    Ties therefore never split (all rows with the same value share a bin) and no bin is empty
    when the column has at least ``n_bins`` distinct values.
    """
    uniq, counts = np.unique(values, return_counts=True)
    if uniq.size < n_bins:
        raise DataError(f"cannot make {n_bins} quantile bins from {uniq.size} distinct values")
    cdf = np.cumsum(counts) / counts.sum()
    edges = np.empty(n_bins - 1, dtype=np.float64)
    lo = 0  # first admissible position in uniq
    for k in range(1, n_bins):
        hi = uniq.size - (n_bins - k)  # leave one distinct value per remaining bin
        pos = lo + int(np.argmin(np.abs(cdf[lo:hi] - k / n_bins)))
        edges[k - 1] = uniq[pos]
        lo = pos + 1
    return edges


def encode_a9a(table: AdultTable, bin_upper_edges: dict[str, np.ndarray]) -> np.ndarray:
    """One-hot encode ``table`` into the 123-column a9a layout (``A9A_LAYOUT``), float32.

    Quantile columns: bin = number of edges strictly below the value (edges are inclusive upper
    bounds). capital-gain/-loss: column 0 when the value is zero, column 1 otherwise.
    Categoricals: one column per category in adult.names order; '?' gives an all-zero group.
    """
    n = len(table)
    x = np.zeros((n, A9A_N_FEATURES), dtype=np.float32)
    rows = np.arange(n)
    offset = 0
    for col, width in A9A_LAYOUT:
        if col in QUANTILE_COLUMNS:
            idx = np.searchsorted(bin_upper_edges[col], table.numeric[col], side="left")
            x[rows, offset + idx] = 1.0
        elif col in ZERO_NONZERO_COLUMNS:
            x[rows, offset + (table.numeric[col] != 0).astype(np.int64)] = 1.0
        else:
            codes = table.categorical[col]
            present = codes != MISSING
            x[rows[present], offset + codes[present]] = 1.0
        offset += width
    return x


def load_a9a(*, data_dir: str | os.PathLike[str] | None = None, verify: bool = True) -> A9a:
    """Rebuild a9a / a9a.t from UCI Adult: 32,561 / 16,281 rows, 123 binary features.

    Bin edges come from the training file only. Labels: >50K -> +1, <=50K -> -1 (``y01_*`` give
    0/1). This is a rebuild, not LIBSVM's byte-identical file.
    """
    (train, train_where), (test, test_where) = _adult_texts(data_dir, verify=verify)
    a = _a9a_of(train, test, train_where, test_where)
    return A9a(
        x_train=a.x_train.copy(),
        y_train=a.y_train.copy(),
        x_test=a.x_test.copy(),
        y_test=a.y_test.copy(),
        bin_upper_edges={c: e.copy() for c, e in a.bin_upper_edges.items()},
    )  # copies: a caller may change its arrays, the cached rebuild stays as built


@functools.lru_cache(maxsize=2)
def _a9a_of(train_text: str, test_text: str, train_where: str, test_where: str) -> A9a:
    """The a9a rebuild of these Adult texts, made once per distinct contents in a process (the
    parse takes ~0.5 s and every a9a run of a sweep asks again); the files are still read and
    verified on every load."""
    train = parse_adult(train_text, source=train_where)
    test = parse_adult(test_text, source=test_where)
    edges = {c: quantile_upper_edges(train.numeric[c]) for c in QUANTILE_COLUMNS}
    return A9a(
        x_train=encode_a9a(train, edges),
        y_train=(2 * train.label - 1).astype(np.float32),
        x_test=encode_a9a(test, edges),
        y_test=(2 * test.label - 1).astype(np.float32),
        bin_upper_edges=edges,
    )


def feature_names() -> list[str]:
    """Names of the 123 a9a columns (``column=category`` or ``column:bin``), 0-based order."""
    names: list[str] = []
    for col, width in A9A_LAYOUT:
        if col in CATEGORIES:
            names.extend(f"{col}={c}" for c in CATEGORIES[col])
        elif col in ZERO_NONZERO_COLUMNS:
            names.extend([f"{col}=0", f"{col}>0"])
        else:
            names.extend(f"{col}:q{k + 1}" for k in range(width))
    return names
