"""The kube-scheduler extender: GPU-aware filter, prioritize and bind over HTTP.

kube-scheduler keeps doing what it does well (CPU, memory, affinity, taints)
and calls this service for what it cannot see: which GPUs, and which share of
them, each pod gets. `service` decides with the online policy on the one
cluster model (`chronotope.solver.cache`), `gang` reserves all-or-nothing
gangs, and `server` is the thin HTTP layer
speaking the `k8s.io/kube-scheduler/extender/v1` wire format (`wire`).
"""
