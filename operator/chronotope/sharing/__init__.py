"""GPU sharing contracts shared by the binder and the node-side device plugin.

Pure data and functions only: no Kubernetes client, no I/O, so the scheduler,
the device plugin and the tests all read one definition of the wire format.
"""
