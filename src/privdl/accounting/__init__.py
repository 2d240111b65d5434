"""Privacy accounting: events, accountants, calibrators and the papers' nominal formulas.

* :func:`decor_step_rdp` -- SecRDP per-step slope of DECOR (Alg 2/3), all threat models.
* :func:`theorem_bound` -- the Theorem 1/6 closed-form upper bound.
* :func:`account_decor` -- composed and converted DECOR budget (user or example level).
* :func:`calibrate_sigma_cor` / :func:`sigma_cdp_range` -- DECOR calibration (default sigma_cdp
  when none is given).
* :func:`dpsgd_budget` / :func:`calibrate_noise_multiplier` -- DP-SGD via dp-accounting.
* ``privsgp_*``, ``porter_*``, ``robust_hdp_*`` -- nominal paper formulas with accounted epsilon.

The high-level functions above (``account_decor``, ``dpsgd_budget``, ``node_budgets``, the
plans) return every epsilon inside a :class:`PrivacyBudget` (accountant, delta, neighbouring
relation, unit, threat model, nominal flag). The building blocks (``event_epsilon``,
``compose_convert``, ``classic_epsilon``, ``improved_epsilon``, ``gaussian_epsilon``,
``robust_hdp_epsilon``) return bare floats for the composition above them; label what you
report from them (``robust_hdp_epsilon`` is the Robust-HDP code's accountant: NOMINAL).
"""

from privdl.accounting._sigma_inverse import diag_inverse_sparse
from privdl.accounting.budget import PrivacyBudget
from privdl.accounting.calibration import (
    DecorCalibration,
    calibrate_sigma_cor,
    sigma_cdp_range,
)
from privdl.accounting.conversion import (
    CONVERSIONS,
    classic_epsilon,
    classic_rho_for_epsilon,
    compose_convert,
    gaussian_epsilon,
    improved_epsilon,
    step_rdp_for_epsilon,
)
from privdl.accounting.decor import DecorAccount, account_decor
from privdl.accounting.dpsgd import (
    calibrate_nodes,
    calibrate_noise_multiplier,
    dpsgd_budget,
    event_epsilon,
    node_budgets,
    wang_fixed_size_rdp,
)
from privdl.accounting.events import DecorStepEvent, SubsampledGaussianEvent
from privdl.accounting.nominal import (
    NominalPlan,
    porter_phi,
    porter_plan,
    porter_sigma,
    privsgp_optimal_steps,
    privsgp_plan,
    privsgp_sigma,
    privsgp_utility,
    robust_hdp_epsilon,
    robust_hdp_noise_multiplier,
    robust_hdp_plan,
)
from privdl.accounting.secrdp import (
    MAX_SUBSETS,
    Adversary,
    PrivacyWarning,
    SecRdpStep,
    a_q,
    cdp_limit_step_rdp,
    decor_step_rdp,
    parse_adversary,
    theorem_bound,
)

__all__ = [
    "CONVERSIONS",
    "MAX_SUBSETS",
    "Adversary",
    "DecorAccount",
    "DecorCalibration",
    "DecorStepEvent",
    "NominalPlan",
    "PrivacyBudget",
    "PrivacyWarning",
    "SecRdpStep",
    "SubsampledGaussianEvent",
    "a_q",
    "account_decor",
    "calibrate_noise_multiplier",
    "calibrate_nodes",
    "calibrate_sigma_cor",
    "cdp_limit_step_rdp",
    "classic_epsilon",
    "classic_rho_for_epsilon",
    "compose_convert",
    "decor_step_rdp",
    "diag_inverse_sparse",
    "dpsgd_budget",
    "event_epsilon",
    "gaussian_epsilon",
    "improved_epsilon",
    "node_budgets",
    "parse_adversary",
    "porter_phi",
    "porter_plan",
    "porter_sigma",
    "privsgp_optimal_steps",
    "privsgp_plan",
    "privsgp_sigma",
    "privsgp_utility",
    "robust_hdp_epsilon",
    "robust_hdp_noise_multiplier",
    "robust_hdp_plan",
    "sigma_cdp_range",
    "step_rdp_for_epsilon",
    "theorem_bound",
    "wang_fixed_size_rdp",
]
