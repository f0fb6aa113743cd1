"""Exporters: turn the core's nn.Modules into artifacts of one format plus manifest entries.

Each module is one format's exporter half (edge_spec.contract.formats): `writer(**options)` and `export_steps`.
Exporters depend on the core (edge_spec.*) and on their own format's helpers under edge_spec.runtimes.
"""
