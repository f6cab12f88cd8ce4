"""Counter-based uniforms for Birder's quantizer: Triton's ``tl.rand`` reproduced bit for bit in torch.

The uniform of element i is a pure function of (seed, position), so the three backends draw the same numbers
and the draws do not depend on how a buffer is cut into blocks, threads or DDP buckets.

``tl.rand(seed, offset)`` (triton/language/random.py, Triton 3.x) is Philox4x32 with 10 rounds
(Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011):

    key     (k0, k1) = (seed & 0xffffffff, seed >> 32) of the seed as a uint64;
    counter (c0, c1, c2, c3) = (offset & 0xffffffff, offset >> 32, 0, 0) of the int64 offset;
    round   c0, c1, c2, c3 = hi(B c2) ^ c1 ^ k0, lo(B c2), hi(A c0) ^ c3 ^ k1, lo(A c0);
            k0 += 0x9E3779B9, k1 += 0xBB67AE85 (mod 2^32), with A = 0xD2511F53, B = 0xCD9E8D57;
    output  the first word c0, read as an int32 v; v = ~v where v < 0 (so 0 <= v < 2^31);
            float32(v) * float32(4.6566127342e-10): uniform on [0, 1), never 1.

Draws must be independent across the workers and between the worker's and the server's quantization: the
server averages the workers' signs, and correlated draws would bias that average. :func:`derive_seed` gives
every (run seed, step, role, rank) its own Philox key; positions within a key never repeat.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

N_ROUNDS = 10
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85  # Weyl increments of the key (the golden ratio and sqrt(3) - 1)
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
UNIFORM_SCALE = 4.6566127342e-10  # largest float32 s with (2^31 - 1) * s < 1 after rounding (Triton's)
_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
ROLES = {"worker": 1, "server": 2}


def round_keys(seed: int) -> list[tuple[int, int]]:
    """The (k0, k1) of each of the 10 rounds for a 64-bit seed: the key schedule does not depend on data."""
    if not 0 <= seed <= _M64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    k0, k1 = seed & _M32, seed >> 32
    return [((k0 + r * KEY_A) & _M32, (k1 + r * KEY_B) & _M32) for r in range(N_ROUNDS)]


def philox_word0(seed: int, positions: torch.Tensor) -> torch.Tensor:
    """First output word of Philox4x32-10 for counters (position lo, position hi, 0, 0), as int64 in [0, 2^32).

    int64 arithmetic: the 32x32-bit products reach 2^64 and wrap, but their bits are right, so the high word
    is (p >> 32) & 0xffffffff (the arithmetic shift's sign bits are masked away). In place where a word is
    dead, and with round 1 written out (c2 = c3 = 0 there): callers pass chunks that fit in cache.
    """
    keys = round_keys(seed)
    p0 = (positions & _M32).mul_(ROUND_A)
    c0 = (positions >> 32).bitwise_xor_(keys[0][0])  # round 1: hi(B * 0) ^ c1 ^ k0
    c2 = (p0 >> 32).bitwise_and_(_M32).bitwise_xor_(keys[0][1])
    c1, c3 = None, p0.bitwise_and_(_M32)  # lo(B * 0) = 0
    for k0, k1 in keys[1:]:
        p0, p2 = c0.mul_(ROUND_A), c2.mul_(ROUND_B)
        c0 = (p2 >> 32).bitwise_and_(_M32).bitwise_xor_(k0)
        if c1 is not None:
            c0.bitwise_xor_(c1)
        c2 = (p0 >> 32).bitwise_and_(_M32).bitwise_xor_(c3).bitwise_xor_(k1)
        c1, c3 = p2.bitwise_and_(_M32), p0.bitwise_and_(_M32)
    return c0


def word_to_uniform(word: torch.Tensor) -> torch.Tensor:
    """Triton's ``uint_to_uniform_float`` for 32-bit words: fold the sign, scale to [0, 1) in float32."""
    folded = torch.where(word >= 1 << 31, word ^ _M32, word)  # ~v of the int32 v < 0, as a non-negative int
    return folded.to(torch.float32) * torch.tensor(UNIFORM_SCALE, dtype=torch.float32, device=word.device)


def uniform(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """float32 uniforms on [0, 1) for the int64 ``offsets``: equal, bit for bit, to ``tl.rand(seed, offsets)``."""
    if offsets.dtype != torch.int64:
        raise ValueError(f"uniform takes int64 offsets, got {offsets.dtype}")
    return word_to_uniform(philox_word0(seed, offsets))


def _splitmix64(x: int) -> int:
    """One step of splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
    OOPSLA 2014): a bijective 64-bit finaliser with full avalanche."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def derive_seed(run_seed: int, step: int, role: str, rank: int) -> int:
    """The Philox seed (a 64-bit key) of one quantization: a pure function of the run, step, role and rank.

    ``role`` is "worker" (Algorithm 1, line 7) or "server" (line 11); ``rank`` names the worker or server.
    The four values are chained through splitmix64, so nearby inputs give unrelated keys: every worker and
    the server draw independent uniforms at every step (correlated draws would bias the server's average).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {sorted(ROLES)}, got {role!r}")
    for name, value in (("run_seed", run_seed), ("step", step), ("rank", rank)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"derive_seed: {name} must be a non-negative int, got {value!r}")
    h = _splitmix64(run_seed & _M64)
    for value in (step, ROLES[role], rank):
        h = _splitmix64(h ^ (value & _M64))
    return h


@dataclass(frozen=True)
class Segments:
    """Where a buffer's elements sit among all parameters: element j of segment s is at
    ``global_offsets[s] + (j - starts[s])``; segment s covers [starts[s], starts[s+1]) of the buffer.

    ``starts`` must begin at 0 and increase strictly; both are int64 and of the same length. A bucket made of
    several parameter views gives one segment per view, so each element draws the same uniform whichever
    bucket it lands in.
    """

    starts: torch.Tensor
    global_offsets: torch.Tensor
    _tables: dict = field(default_factory=dict, init=False, compare=False, repr=False)  # device -> (starts, deltas)

    def __post_init__(self):
        starts = torch.as_tensor(self.starts, dtype=torch.int64).reshape(-1).cpu()
        offsets = torch.as_tensor(self.global_offsets, dtype=torch.int64).reshape(-1).cpu()
        if starts.numel() == 0 or starts.numel() != offsets.numel():
            raise ValueError(
                f"Segments needs as many starts as global_offsets (at least one), got "
                f"{starts.numel()} and {offsets.numel()}"
            )
        if starts[0] != 0 or bool((starts[1:] <= starts[:-1]).any()):
            raise ValueError(f"Segments.starts must begin at 0 and increase strictly, got {starts.tolist()}")
        if bool((offsets < 0).any()):
            raise ValueError("Segments.global_offsets must be non-negative")
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "global_offsets", offsets)

    def on(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(starts, deltas) on ``device``, copied there once and kept: a hook keeps one Segments per bucket, so
        a GPU kernel reads a resident table instead of copying it from pageable host memory at every launch
        (a copy that synchronises the stream)."""
        device = torch.device(device)
        tables = self._tables.get(device)
        if tables is None:
            tables = self._tables[device] = (self.starts.to(device), self.deltas.to(device))
        return tables

    @property
    def deltas(self) -> torch.Tensor:
        """position - buffer index, per segment."""
        return self.global_offsets - self.starts

    def positions(self, lo: int, hi: int, device=None) -> torch.Tensor:
        """int64 positions of buffer elements lo..hi-1."""
        j = torch.arange(lo, hi, dtype=torch.int64, device=device)
        if self.starts.numel() == 1:
            return j + int(self.deltas[0])
        seg = torch.searchsorted(self.starts.to(j.device), j, right=True) - 1
        return j + self.deltas.to(j.device)[seg]


Offset = int | Segments


def as_segments(offset: Offset, numel: int) -> Segments:
    """A plain offset is one segment; a Segments must start inside the buffer."""
    if isinstance(offset, Segments):
        if offset.starts[-1] >= max(numel, 1):
            raise ValueError(f"Segments start at {offset.starts.tolist()}, past the buffer of {numel} elements")
        return offset
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative int or a Segments, got {offset!r}")
    return Segments(torch.zeros(1, dtype=torch.int64), torch.tensor([offset], dtype=torch.int64))


def segment_table(offset: Offset, numel: int) -> tuple[list[int], list[int]]:
    """(starts, deltas) as Python lists, for the kernels."""
    seg = as_segments(offset, numel)
    return seg.starts.tolist(), seg.deltas.tolist()


__all__: Sequence[str] = ("uniform", "derive_seed", "Segments", "as_segments", "round_keys", "N_ROUNDS")
