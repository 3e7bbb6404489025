"""The node-side GPU-sharing hook: a kubelet device plugin (v1beta1 gRPC API).

It advertises a node's GPUs (whole, or split into virtual share devices) and,
in Allocate, hands a container exactly the GPUs and share the binder assigned
to its pod, found by the handshake the binder wrote, never by request size.
See docs/deviceplugin.md. Only `chronotope.kube` talks to the API server.
"""
