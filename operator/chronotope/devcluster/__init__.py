"""A real local Kubernetes control plane with simulated GPU nodes, for development and tests.

Not part of the scheduler itself: this is the ground every test and the demo
stand on. `cluster.LocalCluster` runs the processes, `spec` turns a cluster
spec into kwok nodes, `binaries` builds or finds the pinned binaries.
"""
