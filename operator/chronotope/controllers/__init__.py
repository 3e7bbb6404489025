"""Thin kopf controllers over the pure `workloads` decisions.

They read custom resources and cluster state, call the `workloads` decisions,
and apply the answers through `chronotope.kube`.
"""
