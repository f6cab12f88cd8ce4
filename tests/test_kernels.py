"""Birder's compression kernels (birder_repro.comm.kernels): every backend gives the same bits and state.

The torch backend is the reference (the optimizer's worker_step_ / server_step_ fed with counter-based
uniforms); the cpu backend (numba) and the triton backend (through Triton's interpreter on CPU tensors, in a
subprocess since TRITON_INTERPRET is read when Triton compiles) must equal it with torch.equal. The torch
Philox equals Triton's own tl.rand bit for bit.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from birder_repro.comm import kernels
from birder_repro.comm.kernels import Segments
from birder_repro.comm.pack import pack_bits, unpack_signs
from birder_repro.optim.birder import server_step_, worker_step_

HAS_NUMBA = importlib.util.find_spec("numba") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None
SEED = kernels.derive_seed(7, 3, "worker", 1)
# a buffer of three parameter segments: element j of segment s sits at global_offsets[s] + j - starts[s]
SEGMENTS = Segments([0, 5, 8203], [10_000, 3, (1 << 32) - 40])


def _state(n: int, b_hat: bool):
    """Random g, m, b, e (and b_hat): zeros in g and b, b near eps, |m/b + e| beyond 1, b_hat on both sides."""
    gen = torch.Generator().manual_seed(n * 2 + b_hat)
    g = torch.randn(n, generator=gen)
    g[::7] = 0
    m, b = torch.randn(n, generator=gen) * 0.1, torch.rand(n, generator=gen) * 0.2
    b[::11] = 0
    b[3::13] *= 1e-7  # b near eps: the rounding of b + eps matters
    g[5::17] *= 1e4
    e = torch.randn(n, generator=gen) * 0.7
    bh = torch.rand(n, generator=gen) * 0.2 if b_hat else None
    return g, m, b, e, bh


def _server_inputs(n: int, workers: int):
    gen = torch.Generator().manual_seed(n + workers)
    received = torch.randint(0, 256, (workers, n // 8), dtype=torch.uint8, generator=gen)
    return received, torch.randn(n, generator=gen) * 0.6


def _offset(kind: str, n: int):
    return {"plain": 123_456_789, "segments": SEGMENTS if n > SEGMENTS.starts[-1] else Segments([0, 5], [9, 0])}[kind]


def _run(backend: str, n: int, b_hat: bool, kind: str, workers: int, into: bool = False) -> dict[str, torch.Tensor]:
    """One worker and one server compression. ``into``: the new state goes to ``state_out`` / ``e_bar_out``
    (filled with garbage first), and the old state must come back untouched."""
    g, m, b, e, bh = _state(n, b_hat)
    old = [t.clone() for t in (m, b, e, bh) if t is not None]
    outs = tuple(torch.full_like(t, float("nan")) for t in old) if into else None
    out = {
        "bits": kernels.worker_compress(
            g,
            m,
            b,
            e,
            beta=0.9,
            eps=1e-8,
            seed=SEED,
            offset=_offset(kind, n),
            backend=backend,
            b_hat=bh,
            state_out=outs,
        )
    }
    new = outs if into else tuple(t for t in (m, b, e, bh) if t is not None)
    out.update(zip(("m", "b", "e", "b_hat"), new))
    received, e_bar = _server_inputs(n, workers)
    e_bar_old = e_bar.clone()
    e_bar_out = torch.full_like(e_bar, float("nan")) if into else None
    out["bits_bar"] = kernels.server_compress(
        received, e_bar, seed=SEED + 1, offset=_offset(kind, n), backend=backend, e_bar_out=e_bar_out
    )
    out["e_bar"] = e_bar_out if into else e_bar
    out["signs"] = kernels.unpack(out["bits"], backend=backend)
    if into:  # the old state is whole: it could restore a skipped step
        for t, o in zip([m, b, e, bh, e_bar], old[:3] + ([old[3]] if b_hat else [None]) + [e_bar_old]):
            assert t is None or torch.equal(t, o)
    return out


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs in {int((a[k] != b[k]).sum())} places"


CASES = [
    (n, b_hat, kind, workers)
    for n in (8, 72, 8200, 20_016)
    for b_hat in (False, True)
    for kind in ("plain", "segments")
    for workers in ((1, 3) if n == 20_016 else (2,))
]
# the new state written beside the old (state_out, e_bar_out): the same bits and the same new state
CASES += [(n, b_hat, "segments", 2, True) for n in (72, 8200, 20_016) for b_hat in (False, True)]


# ------------------------------------------------------------------------------------------ the torch reference
def test_uniform_is_a_pure_function_of_seed_and_position():
    offsets = torch.tensor([0, 1, 2, (1 << 32) + 1, (1 << 40) + 5])
    u = kernels.uniform(SEED, offsets)
    assert u.dtype == torch.float32 and bool(((u >= 0) & (u < 1)).all())
    assert torch.equal(u[1:3], kernels.uniform(SEED, offsets[1:3]))  # no state, no dependence on the batch
    assert not torch.equal(u, kernels.uniform(SEED + 1, offsets))


# splitmix64 as its paper writes it (Steele, Lea and Flood, "Fast splittable pseudorandom number generators",
# OOPSLA 2014: nextLong() adds GOLDEN_GAMMA to the seed, then mix64 with the finaliser's constants), written here
# apart from birder_repro's copy; checked below against the generator's published outputs.
_GAMMA, _M64 = 0x9E3779B97F4A7C15, (1 << 64) - 1


def _splitmix64_outputs(seed: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        seed = (seed + _GAMMA) & _M64
        z = ((seed ^ (seed >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        out.append(z ^ (z >> 31))
    return out


# (run seed, step, role, rank) -> derive_seed's documented chain: h = next(run seed), then h = next(h ^ value)
# for the step, the role's number (worker 1, server 2) and the rank, computed with _splitmix64_outputs above.
DERIVED_SEEDS = {
    (5, 1, "worker", 0): 0xE408D4E4A7EEF798,
    (5, 1, "server", 0): 0x94BE6A1B7FBC8C52,
    (5, 1, "worker", 1): 0x9A21AB65D9B51C61,
    (0, 0, "worker", 0): 0xD9EEF7F073D37C42,
    (123456789, 1000000, "server", 3): 0xA4533DF800FFCADF,
}


def test_derive_seed_gives_the_splitmix64_chain_and_independent_draws():
    # The independent splitmix64 gives the generator's known outputs (seed 1234567, and seed 0's first).
    assert _splitmix64_outputs(1234567, 5) == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    assert _splitmix64_outputs(0, 1) == [0xE220A8397B1DCDAF]
    for (run_seed, step, role, rank), expected in DERIVED_SEEDS.items():
        h = _splitmix64_outputs(run_seed, 1)[0]
        for value in (step, {"worker": 1, "server": 2}[role], rank):
            h = _splitmix64_outputs(h ^ value, 1)[0]
        assert h == expected  # the table is the chain, not a copy of what the code returned
        assert kernels.derive_seed(run_seed, step, role, rank) == expected, (run_seed, step, role, rank)
    seeds = {
        kernels.derive_seed(5, step, role, rank)
        for step in range(4)
        for role in ("worker", "server")
        for rank in range(4)
    }
    assert len(seeds) == 32 and all(0 <= s < 1 << 64 for s in seeds)
    pos = torch.arange(200_000)
    draws = torch.stack(
        [
            kernels.uniform(kernels.derive_seed(5, 1, role, rank), pos)
            for role, rank in (("worker", 0), ("worker", 1), ("server", 0))
        ]
    )
    corr = torch.corrcoef(draws.double())
    assert (corr - torch.eye(3, dtype=torch.float64)).abs().max() < 0.01  # 1/sqrt(2e5) = 0.0022


def test_state_out_in_place_gives_the_in_place_result():
    """state_out may name the state itself (the same tensors): that is the in-place update."""
    g, m, b, e, _ = _state(72, False)
    ref = [t.clone() for t in (m, b, e)]
    bits = kernels.worker_compress(g, *ref, seed=SEED, backend="torch")
    assert torch.equal(kernels.worker_compress(g, m, b, e, seed=SEED, backend="torch", state_out=(m, b, e)), bits)
    assert all(torch.equal(x, y) for x, y in zip((m, b, e), ref))


@pytest.mark.parametrize("b_hat", [False, True])
@pytest.mark.parametrize("workers", [2, 3, 6])
def test_torch_backend_equals_the_optimizer_functions(b_hat, workers):
    """The hook's old path (worker_step_, server_step_, mean, pack_bits) fed the same uniforms."""
    n = 4000
    g, m, b, e, bh = _state(n, b_hat)
    ref = [t.clone() if t is not None else None for t in (g, m, b, e, bh)]
    bits = pack_bits(worker_step_(*ref[:4], kernels.uniform(SEED, torch.arange(n) + 99), 0.9, 1e-8, b_hat=ref[4]))
    assert torch.equal(
        kernels.worker_compress(g, m, b, e, beta=0.9, eps=1e-8, seed=SEED, offset=99, backend="torch", b_hat=bh), bits
    )
    for new, old in zip((m, b, e, bh), ref[1:]):
        assert new is None or torch.equal(new, old)
    received, e_bar = _server_inputs(n, workers)
    e_bar_ref = e_bar.clone()
    mean = unpack_signs(received).mean(dim=0)  # as comm/birder.py averages the nodes' chunks
    bits_bar = pack_bits(server_step_(mean, e_bar_ref, kernels.uniform(SEED, torch.arange(n))))
    assert torch.equal(kernels.server_compress(received, e_bar, seed=SEED, backend="torch"), bits_bar)
    assert torch.equal(e_bar, e_bar_ref)


def test_segments_give_each_element_its_global_position():
    n = 8208
    u = kernels.uniform(SEED, SEGMENTS.positions(0, n))
    assert torch.equal(u[:5], kernels.uniform(SEED, torch.arange(10_000, 10_005)))
    assert torch.equal(u[5:8203], kernels.uniform(SEED, torch.arange(3, 8201)))
    assert torch.equal(u[8203:], kernels.uniform(SEED, torch.arange(5) + (1 << 32) - 40))


def test_quantizer_is_unbiased():
    """E[Q(x)] = x on [-1, 1] and the clip outside (Eq. (5)): the server step with a mean of 0 quantizes e_bar."""
    xs = torch.tensor([-1.5, -1.0, -0.7, -0.25, 0.0, 0.1, 0.5, 0.9, 1.0, 2.0])
    draws = 50_000  # standard error of a mean of +-1 draws <= 1/sqrt(draws) = 0.0045; 5 sigma: 0.023
    e_bar = xs.repeat_interleave(draws)
    received = torch.stack(
        [torch.full((e_bar.numel() // 8,), 255, dtype=torch.uint8), torch.zeros(e_bar.numel() // 8, dtype=torch.uint8)]
    )  # +1 and -1: mean 0
    packed = kernels.server_compress(received, e_bar, seed=kernels.derive_seed(1, 1, "server", 0), backend="torch")
    means = kernels.unpack(packed, backend="torch").view(len(xs), draws).mean(dim=1)
    assert (means - xs.clamp(-1, 1)).abs().max() < 0.023
    assert means[0] == -1 and means[-1] == 1 and means[1] == -1 and means[-2] == 1


@pytest.mark.parametrize("backend", ["torch"] + (["cpu"] if HAS_NUMBA else []))
def test_unpack_round_trips(backend):
    bits = torch.rand(2, 808, generator=torch.Generator().manual_seed(0)) < 0.5
    packed = pack_bits(bits.reshape(-1)).view(2, -1)
    signs = kernels.unpack(packed, backend=backend)
    assert signs.shape == (2, 808) and torch.equal(signs, bits.float() * 2 - 1)
    out = torch.empty(1616)
    assert kernels.unpack(packed, backend=backend, out=out).data_ptr() == out.data_ptr()
    assert torch.equal(out, signs.reshape(-1))


@pytest.mark.parametrize("backend", ["torch"] + (["cpu"] if HAS_NUMBA else []))
def test_empty_buffers_give_empty_results(backend):
    z = torch.zeros(0)
    assert kernels.worker_compress(z, z.clone(), z.clone(), z.clone(), backend=backend).numel() == 0
    assert kernels.server_compress(torch.zeros(2, 0, dtype=torch.uint8), z.clone(), backend=backend).numel() == 0
    assert kernels.unpack(torch.zeros(0, dtype=torch.uint8), backend=backend).numel() == 0


# ------------------------------------------------------------------------------------------------ cpu = torch
@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed")
@pytest.mark.parametrize("case", CASES)
def test_cpu_backend_equals_torch(case):
    _assert_same(_run("cpu", *case), _run("torch", *case))


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed")
def test_auto_picks_cpu_on_cpu_tensors_with_torchs_thread_budget():
    assert kernels.resolve_backend("auto", "cpu") == "cpu"
    assert 1 <= kernels.backend_threads("cpu") <= torch.get_num_threads()


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed")
def test_cpu_threads_follow_the_process_budget_from_any_thread(monkeypatch):
    """OMP_NUM_THREADS is the budget even where torch.get_num_threads() says otherwise (the hook's thread)."""
    import threading

    from birder_repro.comm.kernels import cpu

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen = []
    t = threading.Thread(target=lambda: seen.append(cpu.threads()))
    t.start()
    t.join()
    assert seen == [1] and cpu.threads() == 1


@pytest.mark.parametrize(
    "environ,cores,size",
    [
        ({"OMP_NUM_THREADS": "1"}, 2, "1"),  # a launched worker with one thread: a pool of 1, not of every core
        ({"OMP_NUM_THREADS": "4"}, 2, "2"),  # capped at the cores it may run on
        ({"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "3"}, 2, None),  # the user's own setting stays
        ({}, 2, None),  # no budget: numba's default
        ({"OMP_NUM_THREADS": "x"}, 2, None),
    ],
)
def test_numbas_pool_is_the_process_thread_budget(environ, cores, size):
    assert kernels.numba_pool_size(environ, cores) == size


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed")
def test_a_worker_with_one_thread_starts_numba_with_a_pool_of_one():
    """Set before numba is imported, by the package (``import birder_repro.comm.kernels.cpu`` imports it first):
    numba's OpenMP pool of every core spin-waited on the cores the other processes train on."""
    script = "from birder_repro.comm.kernels import cpu; print(cpu.numba.config.NUMBA_NUM_THREADS)"
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    done = subprocess.run(
        [sys.executable, "-c", script], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True
    )
    assert done.stdout.strip() == "1", done.stderr[-2000:]


# ------------------------------------------------------------------------------ triton (interpreter) = torch
TRITON_CASES = [c for c in CASES if c[0] <= 8200]
_TRITON_SCRIPT = textwrap.dedent("""
    import sys, torch
    from birder_repro.comm.kernels import gpu
    import test_kernels as t
    offsets = torch.cat([torch.arange(3000), torch.randint(0, 1 << 62, (3000,), generator=torch.Generator()
                         .manual_seed(0)), torch.tensor([(1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32])])
    seeds = [0, 1, t.SEED, (1 << 31) + 3, (1 << 63) + 5, (1 << 64) - 1]
    out = {"offsets": offsets, "rand": {s: gpu.tl_rand(s, offsets) for s in seeds},
           "cases": {c: t._run("triton", *c) for c in t.TRITON_CASES}}
    torch.save(out, sys.argv[1])
""")


@pytest.fixture(scope="module")
def triton_results(tmp_path_factory):
    if not HAS_TRITON:
        pytest.skip("triton is not installed")
    path = tmp_path_factory.mktemp("triton") / "results.pt"
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT, str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(path)


def test_torch_uniform_equals_triton_tl_rand(triton_results):
    for seed, rand in triton_results["rand"].items():
        assert torch.equal(kernels.uniform(seed, triton_results["offsets"]), rand), f"seed {seed}"


@pytest.mark.parametrize("case", TRITON_CASES)
def test_triton_backend_equals_torch(case, triton_results):
    _assert_same(triton_results["cases"][case], _run("torch", *case))


# ----------------------------------------------------------------------------------------------- bad inputs
def _z(n=16, dtype=torch.float32):
    return torch.zeros(n, dtype=dtype)


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: kernels.worker_compress(_z(dtype=torch.float64), _z(), _z(), _z()), "g must be a float32"),
        (lambda: kernels.worker_compress(_z(12), _z(12), _z(12), _z(12)), "multiple of 8"),
        (lambda: kernels.worker_compress(_z(), _z(8), _z(), _z()), "m has 8 elements, expected 16"),
        (lambda: kernels.worker_compress(_z(), _z(), _z(), _z(), b_hat=_z(24)), "b_hat has 24"),
        (lambda: kernels.worker_compress(_z(), _z(), _z(), _z(), seed=-1), "seed must be"),
        (lambda: kernels.worker_compress(_z(), _z(), _z(), _z(), offset=-3), "offset must be"),
        (lambda: kernels.worker_compress(_z(), _z(), _z(), _z(), offset=Segments([0, 16], [0, 0])), "past the buffer"),
        (lambda: kernels.worker_compress(_z(), _z(), _z(), _z(), backend="cuda"), "choices: auto, torch, cpu, triton"),
        (lambda: kernels.worker_compress(_z(), _z(), _z(), _z(), state_out=(_z(), _z())), "state_out needs 3"),
        (lambda: kernels.worker_compress(_z(), _z(), _z(), _z(), state_out=(_z(), _z(8), _z())), "b' has 8"),
        (lambda: kernels.server_compress(_z(2), _z()), "2-D uint8"),
        (
            lambda: kernels.server_compress(torch.zeros(2, 2, dtype=torch.uint8), _z(16), e_bar_out=_z(8)),
            "e_bar_out has 8",
        ),
        (lambda: kernels.server_compress(torch.zeros(2, 2, dtype=torch.uint8), _z(8)), "e_bar has 8 elements"),
        (lambda: kernels.unpack(_z()), "uint8"),
        (lambda: Segments([1, 4], [0, 0]), "begin at 0"),
        (lambda: Segments([0, 4], [0]), "as many starts"),
        (lambda: kernels.uniform(0, torch.arange(4, dtype=torch.int32)), "int64"),
        (lambda: kernels.derive_seed(0, 0, "client", 0), "role must be"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or not HAS_TRITON, reason="needs triton, not interpreting"
)
def test_triton_on_cpu_tensors_says_how_to_run_it():
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        kernels.unpack(torch.zeros(2, dtype=torch.uint8), backend="triton")


# ------------------------------------------------------------------- GPU launch hygiene (checked on the CPU)
def _specialisation(kernel, args: dict) -> list:
    """What Triton keys a kernel's compiled variant on for these arguments (its own binder, no GPU needed)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    bind = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    return bind(**args)[1]


_SEEDS = [0, 1, 16, 2**31 - 1, 2**31, 2**32 + 16, 2**63 - 1, 2**63, 2**63 + 5, 2**64 - 1, SEED]
_NEEDS_COMPILER = pytest.mark.skipif(
    not HAS_TRITON or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
    reason="needs triton's compiler front end",
)


def _record_launches(monkeypatch) -> list:
    """Every Triton launch from now on, recorded instead of run: (kernel name, Triton's specialisation key)."""
    from triton.runtime.jit import JITFunction

    seen = []

    def record(kernel, *args, grid, warmup, **kwargs):
        bound = dict(zip(kernel.arg_names, args), **{k: v for k, v in kwargs.items() if k in kernel.arg_names})
        seen.append((kernel.fn.__name__, repr(_specialisation(kernel, bound))))

    monkeypatch.setattr(JITFunction, "run", record)
    return seen


def _launch_every_way(gpu) -> None:
    """The wrappers called as the hooks call them, over the integer values a run meets: sizes with nbytes == 1
    and % 16, 1 worker (1 node) and 16 or more, segment tables of 1 to 5 entries, keys of every type class
    (i32, i64, u64, == 1, % 16), a bucket's last byte unpacked from a 1-byte slice at an odd address, and
    buckets past 2^30 elements (meta tensors: nothing is allocated)."""

    def f32(n, device="cpu"):
        return torch.zeros(n, device=device)

    tables = [Segments([0], [0]), Segments([0, 3], [0, 1 << 40]), Segments([0, 1, 2, 5, 7], [9, 0, 3, 1, 2])]
    for n, device in [(8, "cpu"), (16, "cpu"), (24, "cpu"), (1032, "cpu"), ((1 << 30) + 8, "meta")]:
        for seed in _SEEDS:
            for seg, b_hat in zip(tables, (None, f32(n, device), None)):
                state = [f32(n, device) for _ in range(4)]
                gpu.worker_compress(f32(n, device), *state[:3], b_hat, 0.9, 1e-8, seed, seg, tuple(state))
            for workers in (1, 2, 3, 16, 17, 32):
                received = torch.zeros(workers, n // 8, dtype=torch.uint8, device=device)
                gpu.server_compress(received, f32(n, device), seed, tables[seed % 3], f32(n, device))
            gpu.tl_rand(seed, torch.zeros(n // 8, dtype=torch.int64, device=device))
    buf = torch.zeros(300, dtype=torch.uint8)
    for start in (0, 1, 3, 16):
        for nbytes in (1, 2, 16, 129):
            gpu.unpack(buf[start : start + nbytes], f32(8 * nbytes))


@_NEEDS_COMPILER
def test_every_launch_uses_a_variant_the_self_test_compiled(monkeypatch):
    """A variant compiled outside the self-test is a second-long compile on the communication thread at the
    first bucket, while the other nodes wait. Triton keys a variant on each integer argument's type and, unless
    it is in do_not_specialize, on whether it is 1 or divisible by 16 (and on a pointer's 16-byte alignment):
    every launch the wrappers make, for every kernel the module launches, must find a variant the self-test
    (run when a hook attaches) already compiled. Checked with Triton's own specialisation, launches recorded."""
    from triton.runtime.jit import JITFunction

    from birder_repro.comm.kernels import gpu

    seen = _record_launches(monkeypatch)
    with pytest.raises(RuntimeError):  # nothing ran, so its draws are not Philox's: the launches are recorded
        gpu.self_test(torch.device("cpu"))
    compiled = set(seen)
    seen.clear()
    _launch_every_way(gpu)
    kernels_defined = {k for k, v in vars(gpu).items() if isinstance(v, JITFunction) and k.endswith("_kernel")}
    assert {name for name, _ in compiled} == {name for name, _ in seen} == kernels_defined
    new = sorted(set(seen) - compiled)
    assert not new, f"{len(new)} variants compile outside the self-test, first: {new[0]}"
    # the halves put the key back together exactly, in the form tl.rand reads it (a uint64)
    for seed in _SEEDS:
        lo, hi = gpu.seed_halves(seed)
        assert -(1 << 31) <= lo < 1 << 31 and -(1 << 31) <= hi < 1 << 31
        assert ((hi & 0xFFFFFFFF) << 32) | (lo & 0xFFFFFFFF) == seed


class _CurrentCudaDevice:
    """A stand-in for ``torch.cuda.device``: keeps which device is current, as the real one does."""

    current = None

    def __init__(self, device):
        self.device, self.before = device, None

    def __enter__(self):
        self.before, _CurrentCudaDevice.current = _CurrentCudaDevice.current, self.device
        return self

    def __exit__(self, *exc):
        _CurrentCudaDevice.current = self.before


@_NEEDS_COMPILER
def test_launches_run_under_the_tensors_cuda_device(monkeypatch):
    """Triton launches on the current CUDA device: a model on cuda:1 without torch.cuda.set_device(1) ran the
    kernels (the self-test first) on cuda:0 with pointers into cuda:1. Every launch of every wrapper and of the
    self-test goes through gpu._launch with the device of the tensors it is handed, and _launch makes that
    device current around the launch (checked with stand-ins for the launch and for torch.cuda.device)."""
    from birder_repro.comm.kernels import gpu

    monkeypatch.setattr(torch.cuda, "device", _CurrentCudaDevice)
    ran = []

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: ran.append((_CurrentCudaDevice.current, kwargs["enable_fp_fusion"]))

    gpu._launch(Kernel(), (1,), torch.device("cuda", 1), torch.zeros(1))
    assert ran == [(torch.device("cuda", 1), False)] and _CurrentCudaDevice.current is None
    seen, guarded, real = _record_launches(monkeypatch), [], gpu._launch

    def checked(kernel, grid, device, *args, **kwargs):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        guarded.append(all(t.device == device for t in tensors) and len(tensors) >= 2)
        real(kernel, grid, device, *args, **kwargs)

    monkeypatch.setattr(gpu, "_launch", checked)
    with pytest.raises(RuntimeError):
        gpu.self_test(torch.device("cpu"))
    _launch_every_way(gpu)
    assert len(guarded) == len(seen) > 0 and all(guarded)


_MASK_SCRIPT = textwrap.dedent("""
    import sys, torch, triton, triton.language as tl
    from birder_repro.comm.kernels import gpu

    @triton.jit
    def probe(j_ptr, out_ptr, nbytes, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(out_ptr + i, gpu._in_bytes(tl.load(j_ptr + i), nbytes).to(tl.int8))

    nbytes = 1 << 29  # 8 * nbytes = 2^32: a 32-bit product wraps to 0
    j = torch.tensor([0, 7, (1 << 31) + 5, (1 << 32) - 1, 1 << 32, (1 << 32) + 9, 3 << 31, 5], dtype=torch.int64)
    out = torch.zeros(8, dtype=torch.int8)
    probe[(1,)](j, out, nbytes, BLOCK=8)
    torch.save(out, sys.argv[1])
""")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_kernel_masks_hold_past_two_to_the_31_elements(tmp_path):
    """The masks compare int64 element indices with a byte count, not with 8 * nbytes, which wraps in 32 bits
    past 2^31 elements (the allgather variant's unpack with many workers). Under the interpreter, which keeps
    Triton's integer types, with the helper the kernels use."""
    path = tmp_path / "mask.pt"
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _MASK_SCRIPT, str(path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert torch.load(path).tolist() == [1, 1, 1, 1, 0, 0, 0, 1]


def test_segment_tables_are_copied_to_a_device_once(monkeypatch):
    """A copy from pageable host memory synchronises the stream: one per Segments and device, then reused. The
    meta device stands in for a GPU (on the CPU ``.to("cpu")`` is no copy, so a CPU check could not fail)."""
    seg, copies, real_to = Segments([0, 5], [100, 7]), [], torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda t, *a, **k: copies.append(a) or real_to(t, *a, **k))
    first = seg.on("meta")
    made = len(copies)
    for _ in range(3):
        again = seg.on(torch.device("meta"))
    assert made == 2 and len(copies) == made and first[0].device.type == "meta"
    assert again[0] is first[0] and again[1] is first[1]
    assert seg.on("cpu")[1].tolist() == [100, 2]


def test_a_hook_keeps_one_segment_table_per_bucket_and_range():
    """Birder's draws for a bucket are built once and reused at every step (no host-to-device copy per launch)."""
    from birder_repro.comm.birder import BirderState
    from birder_repro.comm.buckets import Bucket
    from birder_repro.comm.topology import Topology

    state = BirderState(
        Topology(rank=0, world_size=1, gpus_per_node=1), scheme="flat", param_numels=[10, 6], overlap=False
    )
    bucket = Bucket(((0, 0, 10), (1, 10, 6)), 16, 16, {})
    seed1, where1 = state._draws(bucket, "worker", 0, 16)
    bucket.step += 1
    seed2, where2 = state._draws(bucket, "worker", 0, 16)
    assert where1 is where2 and seed1 != seed2
    assert where1.positions(0, 16).tolist() == list(range(16))


@pytest.mark.parametrize("how", ["passes", "compile_error", "wrong_philox"])
def test_triton_self_test_refuses_in_one_line(how, tmp_path):
    """check_backend compiles every variant and compares tl.rand with the CPU's Philox when a hook attaches: a
    Triton that cannot compile, or draws other numbers, is refused in one line naming the way out."""
    script = textwrap.dedent(f"""
        import torch
        from birder_repro.comm import kernels
        from birder_repro.comm.kernels import gpu, philox
        how = {how!r}
        if how == "compile_error":
            gpu.unpack = lambda packed, out: (_ for _ in ()).throw(ValueError("PTX assembly failed\\nmore"))
        if how == "wrong_philox":
            philox.uniform = lambda seed, offsets: torch.zeros(offsets.shape)
        try:
            kernels.check_backend("triton", "cpu")
            print("OK")
        except RuntimeError as exc:
            print("ERR", str(exc))
    """)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout.strip()
    assert "\n" not in out
    if how == "passes":
        assert out == "OK"
    elif how == "compile_error":
        assert out.startswith("ERR the triton kernels backend does not run") and "PTX assembly failed" in out
        assert "kernel_backend=torch" in out and "more" not in out
    else:
        assert out.startswith("ERR") and "tl.rand does not draw Philox4x32-10" in out and "kernel_backend=torch" in out


def test_auto_backend_on_cuda_without_triton_is_an_error(monkeypatch):
    monkeypatch.setattr(kernels, "available_backends", lambda device="cpu": ["torch"])
    with pytest.raises(ValueError, match="auto on CUDA needs Triton.*kernel_backend=torch"):
        kernels.resolve_backend("auto", "cuda")


def test_no_deprecated_collective_names():
    """torch 2.14 deprecates reduce_scatter_tensor / all_gather_into_tensor (FutureWarning on every call)."""
    import pathlib

    import birder_repro
    from birder_repro.comm import collectives

    root = pathlib.Path(birder_repro.__file__).parent
    offenders = [
        str(p)
        for p in root.rglob("*.py")
        if p.name != "collectives.py"
        and ("dist.reduce_scatter_tensor" in p.read_text() or "dist.all_gather_into_tensor" in p.read_text())
    ]
    assert offenders == []
    import torch.distributed as dist

    if hasattr(dist, "reduce_scatter_single"):
        assert collectives.reduce_scatter_flat is dist.reduce_scatter_single
