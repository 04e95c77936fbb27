"""Decisions over time: per-step imbalance, routing drift, and engines' periodic rebalancing (EPLB) replayed."""
