"""Runtimes: each implements edge_spec.contract.backend.Backend over one execution engine.

Runtimes depend only on the core (edge_spec.*), never on edge_spec.exporters.
"""
