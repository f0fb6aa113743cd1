"""Exporters: turn the core's nn.Modules into artifacts of one format plus manifest entries.

Exporters depend only on the core (edge_spec.*), never on edge_spec.runtimes.
"""
