"""Empirical privacy auditing: lower bounds on epsilon beside the accountants' upper bounds.

:func:`audit` runs a mechanism as implemented on neighbouring inputs and certifies a lower bound
on its epsilon (:mod:`privdl.audit.api`); the estimators (:mod:`privdl.audit.estimators`) and
the adversary's test (:mod:`privdl.audit.scores`) are usable on their own; so is the one-run
bound (:mod:`privdl.audit.one_run`, Steinke, Nasr and Jagielski 2023).
"""

from privdl.audit.api import AUDITED, AuditResult, audit
from privdl.audit.estimators import (
    AuditBound,
    clopper_pearson_upper,
    empirical_tradeoff,
    epsilon_lower_bound,
    epsilon_lower_bound_from_scores,
    epsilon_lower_bound_heldout,
    gdp_epsilon_lower_bound,
)
from privdl.audit.one_run import (
    OneRunBound,
    one_run_bound_from_scores,
    one_run_epsilon_lower_bound,
    one_run_guesses,
    one_run_p_value,
)

__all__ = [
    "AUDITED",
    "AuditBound",
    "AuditResult",
    "OneRunBound",
    "audit",
    "clopper_pearson_upper",
    "empirical_tradeoff",
    "epsilon_lower_bound",
    "epsilon_lower_bound_from_scores",
    "epsilon_lower_bound_heldout",
    "gdp_epsilon_lower_bound",
    "one_run_bound_from_scores",
    "one_run_epsilon_lower_bound",
    "one_run_guesses",
    "one_run_p_value",
]
