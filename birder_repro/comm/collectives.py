"""Collectives under the names the installed torch prefers.

torch 2.14 renamed ``all_gather_into_tensor`` to ``all_gather_single`` (same arguments) and warns on the old
name; older releases only have the old one.
"""

import torch.distributed as dist

all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
