"""Deterministic simulation: a seeded network, an in-memory log, a Raft cluster and its checker.

Library code (no trio, no sockets, no clock reads): tests and ``python -m hasvc.testing.raft_sim``
use it; the network is generic so other pure cores can run on it too.
"""
