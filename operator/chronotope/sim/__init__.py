"""Simulators: GPU traces replayed against the scheduling policies, without a cluster.

`openb` reads the Alibaba GPU-sharing trace, `engine` replays it with one
online policy, `batched` places windows of arrivals jointly, `bound` computes
LP upper bounds, and `runner` fans runs out and writes the results.
`training` simulates a training cluster under rival policies. `replay`
prepares and scores the same arrivals on a real cluster, and `clusterspec`
describes the simulated GPU nodes of a local cluster.
"""
