"""Optimized correlated noise for DECOR: per-node and per-edge variances chosen to minimize the
residual noise after gossip, certified by the SecRDP accountant (docs/noise-design.md)."""

from privdl.design.api import DesignResult, design_noise, optimize_design

__all__ = ["DesignResult", "design_noise", "optimize_design"]
