"""Empirical privacy auditing: lower bounds on epsilon beside the accountants' upper bounds.

So far the estimators (:mod:`privdl.audit.estimators`); the ``privdl audit`` command that runs
the mechanisms as implemented on neighbouring inputs is not built yet.
"""

from privdl.audit.estimators import (
    AuditBound,
    clopper_pearson_upper,
    epsilon_lower_bound,
    epsilon_lower_bound_from_scores,
    gdp_epsilon_lower_bound,
)

__all__ = [
    "AuditBound",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "epsilon_lower_bound_from_scores",
    "gdp_epsilon_lower_bound",
]
