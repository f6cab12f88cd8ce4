"""The performance model: a training step's time and throughput on any cluster layout from a one-node profile.

collectives      alpha-beta costs of the collectives (Thakur, Rabenseifner and Gropp 2005)
schemes          every communication scheme as the collectives it issues per bucket, and their bytes
cluster          the two link levels of a cluster config, and what one collective costs on them
timeline         the backward pass with the buckets' communication overlapped (wait-free backprop), or not
implementations  per scheme, overlapped or not and per bucket or whole: ``this`` project's hooks, the ``paper``'s
profile          what one node's profile holds; loading it from a run, a record or a file
paper_profiles   the paper's 8 x A100 nodes, from its 1-node rows; BERT-Large on the 1-bit Adam paper's V100
                 nodes, from its Table 1's 1-node rows (data: profiles/paper.yaml)
model            predict_step / predict_run
predict          predict_record(cfg): a run record with status "predicted"
validate         the paper's multi-node rows predicted from its 1-node rows (python -m ...validate)
shape            the all-reduce's shape across nodes (flat ring, two-level, tree) found from its growth
published        every published real-cluster row and claim under one protocol (python -m ...published)
"""

from .cluster import ClusterSpec, op_time
from .model import StepPrediction, predict_run, predict_step
from .profile import Profile, ddp_bucket_elements, load_profile

__all__ = [
    "ClusterSpec",
    "Profile",
    "StepPrediction",
    "ddp_bucket_elements",
    "load_profile",
    "op_time",
    "predict_run",
    "predict_step",
]
