"""The distinguishing test of an audit: a linear score learned on held-out trials.

An adversary who sees a view ``y`` (every message its threat model shows it, plus its own secrets)
must decide whether the canary was ``-C`` or ``+C``. For a Gaussian view with the same covariance
in both worlds the most powerful test (Neyman-Pearson) thresholds the linear score
``(m_1 - m_0)^T S^-1 y`` (Fisher's discriminant). The audit does not take ``S`` from the
accountant's model of the mechanism: it estimates the means and the pooled covariance from trials
of the implementation itself, so a mistake that correlates noise across steps or nodes, drops or
shrinks it, shows up in ``S`` and the test exploits it. Fitted on one set of trials, the score is
evaluated on others (:func:`privdl.audit.estimators.epsilon_lower_bound_heldout`), so whatever it
learns, the lower bound stays valid.

A linear score cannot see a canary that shows in one step of many at a random place (an example
that joins exactly one minibatch per epoch): :class:`ScanTest`, the largest standardised deviation
over the features, can. For a canary example in Poisson-sampled minibatches the likelihood ratio
of the mixture, :class:`MixtureTest`, is the most powerful (it takes the sampling rate the run
is accounted with; the shift per inclusion it estimates). The audit fits these on the fitting trials and keeps the one whose bound is
larger there (a choice made on the fitting trials only, so the certified bound stays valid).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privdl.errors import PrivacyError

__all__ = [
    "LinearTest",
    "MixtureTest",
    "ScanTest",
    "fit_linear_test",
    "fit_mixture_test",
    "fit_scan_test",
]

#: Ridge added to the pooled covariance, relative to its mean diagonal (keeps the solve stable
#: when a view has more features than the fit has trials, or features with no noise at all).
RIDGE = 1e-9


@dataclass(frozen=True)
class LinearTest:
    """``score(y) = direction . (y - centre)``: larger means "canary present" (``+C``)."""

    direction: np.ndarray
    centre: np.ndarray

    def scores(self, views: np.ndarray) -> np.ndarray:
        """The scores of trials ``views`` ``(trials, features)``."""
        return (np.asarray(views, np.float64) - self.centre) @ self.direction


def fit_linear_test(views: np.ndarray, present: np.ndarray) -> LinearTest:
    """Fisher's discriminant of ``views`` ``(trials, features)`` labelled by ``present`` (bool):
    class means and the pooled within-class covariance, estimated from these trials."""
    x = np.asarray(views, np.float64)
    lab = np.asarray(present, bool)
    if x.ndim != 2 or lab.shape != (x.shape[0],):
        raise PrivacyError("views must be (trials, features) with one label per trial")
    if lab.sum() < 2 or (~lab).sum() < 2:
        raise PrivacyError("need at least 2 fit trials with and 2 without the canary")
    m1, m0 = x[lab].mean(axis=0), x[~lab].mean(axis=0)
    centred = np.where(lab[:, None], x - m1, x - m0)
    cov = centred.T @ centred / max(x.shape[0] - 2, 1)
    scale = float(np.trace(cov)) / cov.shape[0]
    ridge = RIDGE * (scale if scale > 0 else 1.0)
    direction = np.linalg.solve(cov + ridge * np.eye(cov.shape[0]), m1 - m0)
    return LinearTest(direction, 0.5 * (m0 + m1))


@dataclass(frozen=True)
class ScanTest:
    """``score(y) = max_j sign_j (y_j - m0_j) / s_j``: the largest standardised deviation towards
    the canary over the features (for a canary that shows in one step of many, e.g. when each
    example joins exactly one minibatch per epoch)."""

    sign: np.ndarray
    centre: np.ndarray
    scale: np.ndarray

    def scores(self, views: np.ndarray) -> np.ndarray:
        z = (np.asarray(views, np.float64) - self.centre) / self.scale
        return np.max(self.sign * z, axis=1)


def fit_scan_test(views: np.ndarray, present: np.ndarray) -> ScanTest:
    """The scan statistic's direction and scale per feature, from these trials."""
    m1, m0, s = _class_stats(views, present)
    return ScanTest(np.where(m1 >= m0, 1.0, -1.0), m0, s)


@dataclass(frozen=True)
class MixtureTest:
    """The likelihood ratio of a canary that joins each step with probability ``rate`` (Poisson
    subsampling): ``sum_t log(1 - rate + rate exp(a_t z_t - a_t^2 / 2))`` with ``z_t`` the
    standardised feature and ``a_t`` the shift of one inclusion in units of the noise."""

    rate: float
    shift: np.ndarray
    centre: np.ndarray
    scale: np.ndarray

    def scores(self, views: np.ndarray) -> np.ndarray:
        z = (np.asarray(views, np.float64) - self.centre) / self.scale
        a = self.shift
        log_in = a * z - 0.5 * a * a
        return np.sum(np.logaddexp(np.log1p(-self.rate), np.log(self.rate) + log_in), axis=1)


def fit_mixture_test(views: np.ndarray, present: np.ndarray, rate: float) -> MixtureTest:
    """The mixture test of a canary included at ``rate``: the mean shift of one inclusion is the
    present-minus-absent mean difference over ``rate``, per feature, from these trials."""
    if not 0 < rate < 1:
        raise PrivacyError(f"the inclusion rate must lie in (0, 1), got {rate}")
    m1, m0, s = _class_stats(views, present)
    return MixtureTest(float(rate), (m1 - m0) / (rate * s), m0, s)


def _class_stats(views: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per feature: the mean with and without the canary, and the std without it (a zero std
    floored far below the others, so a noise-free feature still divides)."""
    x = np.asarray(views, np.float64)
    lab = np.asarray(present, bool)
    s = x[~lab].std(axis=0)
    s = np.where(s > 0, s, max(float(s.max()), 1.0) * 1e-12)
    return x[lab].mean(axis=0), x[~lab].mean(axis=0), s
