"""Empirical privacy auditing: lower bounds on epsilon beside the accountants' upper bounds.

:func:`audit` runs a mechanism as implemented on neighbouring inputs and certifies a lower bound
on its epsilon (:mod:`privdl.audit.api`); the estimators (:mod:`privdl.audit.estimators`) and
the adversary's test (:mod:`privdl.audit.scores`) are usable on their own.
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

__all__ = [
    "AUDITED",
    "AuditBound",
    "AuditResult",
    "audit",
    "clopper_pearson_upper",
    "empirical_tradeoff",
    "epsilon_lower_bound",
    "epsilon_lower_bound_from_scores",
    "epsilon_lower_bound_heldout",
    "gdp_epsilon_lower_bound",
]
