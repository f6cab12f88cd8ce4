"""Single-process references written from the papers, with no code of the hooks they check.

:mod:`.birder` (Birder paper, Algorithm 1 with section 4's sharding) and :mod:`.onebit` (1-bit Adam paper,
Algorithm 1; 1-bit LAMB paper, Algorithm 1). The tests compare the hooks with them on gloo, and ``make
gpu-check`` (:mod:`birder_repro.gpucheck`) on NCCL: they ship with the package so that an installed copy can run
that check on a GPU node.
"""
