"""Pure decisions for Chronotope's workloads: what to run, where, and what status to show.

The kopf controllers translate custom resources and cluster objects (plain
dicts) into calls here and apply the answers; nothing in this package talks
to the API server.
"""
