"""Thin kopf controllers: they read custom resources and cluster state, call the pure
`workloads` decisions, and apply the answers through `chronotope.kube`."""
