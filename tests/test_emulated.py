"""cluster=emulated: the fabric's plan and commands, the node commands (the link counters as a probe of the
training loop: tests/test_probes.py), and (as root, with iproute2) real namespaces: shaped links, counted bytes,
and nothing of ours
left after a run that ends, fails, is stopped, or is killed with SIGKILL and followed by another run.

The fast tests that make namespaces run trivial node commands in them (a Python one-liner instead of
torchrun), so that they test the launcher's life cycle in seconds; the slow ones run real training.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from birder_repro import cli
from birder_repro.config import settings as layout
from birder_repro.launch import choose_launcher, emulated, emulated_nodes, node_processes
from birder_repro.launch.process import Command
from birder_repro.netns import build, counters, plan
from birder_repro.run import record

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
CAN_NETNS = os.geteuid() == 0 and shutil.which("ip") is not None and shutil.which("tc") is not None
needs_netns = pytest.mark.skipif(
    not CAN_NETNS, reason="needs root and iproute2 (ip, tc) to make network namespaces (apt-get install -y iproute2)"
)
TINY = [
    "experiment=smoke",
    "logger=none",
    "model.size=tiny",
    "train.batch_size=8",
    "data.synthetic_train_size=64",
    "data.synthetic_eval_size=16",
    "train.eval_max_batches=1",
]


def resolved(compose, overrides):
    return layout.resolve(compose(["cluster=emulated", *overrides]), gpu_count=0)


def ours(run_id: str) -> set[str]:
    """Every namespace, link, hosts directory and state file of one run that is still there."""
    left = set(build.list_ours().get(run_id, set()))
    left |= {str(p) for p in build.NETNS_ETC.glob(f"{plan.PREFIX}-{run_id}-*")} if build.NETNS_ETC.is_dir() else set()
    state = build.STATE_DIR / f"{run_id}.json"
    return left | ({str(state)} if state.exists() else set())


# ------------------------------------------------------------------------------------------- the plan
def test_plan_names_fit_interfaces_and_carry_the_run_id():
    fabric = plan.plan_fabric(12, "10.77.0.0/24", plan.Shaping(200.0, 25000), run_id="a1b2c3")
    names = [fabric.bridge] + [n for node in fabric.nodes for n in (node.host_veth, node.node_veth)]
    assert all(len(n) <= 15 for n in names), names  # Linux's IFNAMSIZ
    assert [n.address for n in fabric.nodes[:3]] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert fabric.nodes[11].netns == "bdrp-a1b2c3-11"
    assert {plan._run_id_of(n) for n in names + fabric.namespaces} == {"a1b2c3"}
    assert plan._run_id_of("eth0") is None and plan._run_id_of("bdrpXYZ") is None
    with pytest.raises(ValueError, match="no room"):
        plan.plan_fabric(4, "10.77.0.0/30", plan.Shaping(None))


def test_burst_is_a_millisecond_of_traffic_and_at_least_two_frames():
    assert plan.burst_bytes(200, 1.0) == 25_000  # 200e6 / 8 bytes/s x 1 ms
    assert plan.burst_bytes(10_000, 1.0) == 1_250_000
    assert plan.burst_bytes(1, 1.0) == 2 * 1514


def test_setup_shapes_both_directions_and_teardown_removes_everything():
    fabric = plan.plan_fabric(2, "10.77.0.0/24", plan.Shaping(200.0, 25000, 100.0), run_id="a1b2c3")
    setup = [" ".join(c) for c in plan.setup_commands(fabric)]
    tbf = "root tbf rate 200mbit burst 25000 latency 100ms"
    assert f"tc -n bdrp-a1b2c3-0 qdisc add dev bdrpa1b2c3n0 {tbf}" in setup  # node 0's uplink
    assert f"tc qdisc add dev bdrpa1b2c3h1 {tbf}" in setup  # node 1's downlink
    assert "ip -n bdrp-a1b2c3-1 addr add 10.77.0.2/24 dev bdrpa1b2c3n1" in setup
    assert "ip -n bdrp-a1b2c3-0 link set lo up" in setup
    teardown = [" ".join(c) for c in plan.teardown_commands(fabric)]
    assert teardown[-1] == "ip link delete bdrpa1b2c3br" and "ip netns delete bdrp-a1b2c3-1" in teardown
    unshaped = plan.plan_fabric(2, "10.77.0.0/24", plan.Shaping(None), run_id="a1b2c3")
    assert not any(c[0] == "tc" for c in plan.setup_commands(unshaped))


def node_run_dir(compose, tmp_path: Path, overrides: list[str]) -> tuple:
    """The resolved config and a run directory holding its files, as the user's CLI leaves them."""
    cfg = resolved(compose, overrides)
    run_dir = tmp_path / "run"
    record.write_run_files(run_dir, cfg, record.format_command(["birder-repro", "cluster=emulated", *overrides]))
    return cfg, run_dir


def test_each_node_runs_the_cli_with_the_users_overrides_as_one_node_in_its_namespace(compose, tmp_path):
    overrides = ["nodes=3", "gpus_per_node=2", "launcher.master_port=4321", "train.steps=5"]
    cfg, run_dir = node_run_dir(compose, tmp_path, overrides)
    fabric = emulated.fabric_for(cfg, run_id="a1b2c3")
    cmds = emulated.commands(cfg, run_dir, fabric, env={})
    for k, cmd in enumerate(cmds):
        assert cmd.argv[:4] == ["ip", "netns", "exec", f"bdrp-a1b2c3-{k}"]
        pin = emulated_nodes.pin_prefix(cfg, k)  # taskset where this machine has a core per node
        assert cmd.argv[4 : 4 + len(pin)] == pin
        cli_args = cmd.argv[4 + len(pin) :]
        assert cli_args[1:3] == ["-m", "birder_repro.cli"]
        assert cli_args[3:] == [
            "cluster=emulated",
            *overrides,
            "launcher=torchrun",
            f"launcher.node_rank={k}",
            "launcher.master_addr=10.77.0.1",
            "launcher.rdzv_id=emulated-a1b2c3",
            f"hydra.run.dir={run_dir.resolve()}",
            "hydra.output_subdir=null",
        ]
        assert cmd.env[emulated_nodes.NODE_ENV] == str(k)  # the node's CLI builds no fabric
        assert cmd.env["PET_LOCAL_ADDR"] == f"10.77.0.{k + 1}"  # torchrun --local-addr
        assert cmd.env["PET_RDZV_CONF"] == f"is_host={int(k == 0)}"  # torchrun --rdzv-conf
        assert cmd.env["GLOO_SOCKET_IFNAME"] == cmd.env[emulated.LINK_IFACE_ENV] == f"bdrpa1b2c3n{k}"
        assert cmd.env["CUDA_VISIBLE_DEVICES"] == ""
    static_cfg, static_dir = node_run_dir(compose, tmp_path / "static", ["nodes=2", "launcher.rdzv_backend=static"])
    static = emulated.commands(static_cfg, static_dir, fabric, {})
    assert "launcher.node_rank=1" in static[1].argv and "PET_RDZV_CONF" not in static[1].env


def test_a_nodes_cli_starts_that_nodes_torchrun_at_node_0(compose, tmp_path):
    """The node's command line, run as a dry run in its environment: one node's torchrun, at node 0's address,
    with the emulated cluster's rendezvous id, in the one run directory."""
    overrides = ["nodes=2", "gpus_per_node=2", "launcher.master_port=4321", "logger=none"]
    cfg, run_dir = node_run_dir(compose, tmp_path, overrides)
    cmd = emulated.commands(cfg, run_dir, emulated.fabric_for(cfg, run_id="a1b2c3"), env={})[1]
    cli_args = cmd.argv[cmd.argv.index(sys.executable) :]
    node_cli = compose(["cluster=emulated", "launcher=torchrun"])
    assert choose_launcher(node_cli, env={emulated_nodes.NODE_ENV: "1"}) == "torchrun"
    out = subprocess.run(
        [*cli_args, "dry_run=true"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cmd.env, "BIRDER_RUNS": str(tmp_path / "elsewhere")},
    )
    assert out.returncode == 0, out.stderr
    assert f"Run directory with the resolved config: {run_dir.resolve()}" in out.stdout
    lines = [line for line in out.stdout.splitlines() if "torch.distributed.run" in line]
    assert len(lines) == 2  # a torchrun dry run prints every node's line; they are the same with c10d
    for arg in (
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-endpoint=10.77.0.1:4321",
        "--rdzv-id=emulated-a1b2c3",
        f"--run-dir {run_dir.resolve()}",
    ):
        assert arg in lines[1], arg
    assert not (tmp_path / "elsewhere").exists() and not (run_dir / ".hydra").exists()


def test_a_run_whose_overrides_are_unknown_is_refused(compose, tmp_path):
    cfg = resolved(compose, ["nodes=2"])
    record.write_run_files(tmp_path, cfg, "birder-repro  # run(cfg) called with a config composed elsewhere")
    with pytest.raises(layout.ConfigError, match="overrides are unknown"):
        emulated.commands(cfg, tmp_path, emulated.fabric_for(cfg, run_id="a1b2c3"), env={})


def test_each_node_gets_its_own_block_of_cores(compose, monkeypatch):
    assert emulated_nodes.node_cores(2, [0, 1, 2, 3, 4]) == [[0, 1], [2, 3]]
    assert emulated_nodes.node_cores(3, [0, 1]) == [[], [], []]  # fewer cores than nodes: no pinning
    monkeypatch.setattr(emulated.os, "sched_getaffinity", lambda pid: {4, 5, 6, 7})
    cfg = resolved(compose, ["nodes=2"])
    assert [emulated_nodes.pin_prefix(cfg, k) for k in range(2)] == [["taskset", "-c", "4,5"], ["taskset", "-c", "6,7"]]
    assert emulated_nodes.pin_prefix(resolved(compose, ["nodes=2", "cluster.pin_cores=false"]), 0) == []
    # cluster.cores_per_node: a 1-node profile on the cores one node of a 2 x 2 run has
    one_core = resolved(compose, ["nodes=1", "cluster.cores_per_node=1"])
    assert emulated_nodes.pin_prefix(one_core, 0) == ["taskset", "-c", "4"]
    assert emulated_nodes.node_cores(2, [0, 1, 2, 3, 4], per=1) == [[0], [1]]
    with pytest.raises(layout.ConfigError, match="cluster.cores_per_node=3 on 2 node"):
        emulated_nodes.node_cores(2, [0, 1, 2, 3, 4], per=3)


def test_emulated_is_chosen_by_auto_and_refuses_other_launchers_and_netem(compose):
    assert choose_launcher(compose(["cluster=emulated"]), env={}) == "emulated"
    with pytest.raises(layout.ConfigError, match="launcher=auto"):
        choose_launcher(compose(["cluster=emulated", "launcher=local"]), env={})
    for overrides, key in (
        (["cluster.latency_ms=5"], "cluster.latency_ms"),
        (["device=cuda"], "device=cpu"),
        (["nodes=100"], "nodes=100"),
        (["nodes=2", "gpus_per_node=8"], "max_local_processes"),
    ):
        cfg = resolved(compose, overrides)
        with pytest.raises(layout.ConfigError, match=re.escape(key)):
            emulated.check_config(cfg)
    with pytest.raises(layout.ConfigError, match=re.escape("cluster.link_mbit=0: give a rate > 0")):
        resolved(compose, ["cluster.link_mbit=0"])  # every cluster's check (birder_repro.config.settings.check_link)
    with pytest.raises(layout.ConfigError, match="cluster.subnet"):
        emulated.fabric_for(resolved(compose, ["nodes=8", "cluster.subnet=10.77.0.0/30"]))


def test_require_tools_says_what_to_do(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda tool, path=None: None)
    with pytest.raises(build.EmulationUnavailable) as err:
        build.require_tools()
    assert "root" in str(err.value) and "apt-get install -y iproute2" in str(err.value)


def test_dry_run_prints_the_fabric_and_one_cli_per_namespace_and_makes_nothing(runs_dir):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "birder_repro.cli",
            "cluster=emulated",
            "nodes=4",
            "dry_run=true",
            "cluster.link_mbit=100",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    nodes = [line for line in out.stdout.splitlines() if "-m birder_repro.cli" in line]
    assert len(nodes) == 4 and all(
        line.startswith(f"{emulated_nodes.NODE_ENV}=")
        and " &  # node " in line
        and "cluster=emulated nodes=4 cluster.link_mbit=100 launcher=torchrun" in line
        for line in nodes
    )
    assert out.stdout.count("root tbf rate 100mbit burst 12500 latency 100ms") == 8
    assert "ip netns delete" in out.stdout
    assert not list(runs_dir.rglob(record.RECORD_FILE))
    if CAN_NETNS:  # the fabric it printed was not made (others' runs may make theirs meanwhile: the machine is shared)
        (run_id,) = set(re.findall(rf"ip netns add {plan.PREFIX}-(\w+)-0\b", out.stdout))
        assert run_id not in build.list_ours() and ours(run_id) == set()


# ------------------------------------------------------------------------------- the link counters
def test_read_counters_from_sysfs_and_snmp(tmp_path):
    stats = tmp_path / "net" / "veth0" / "statistics"
    stats.mkdir(parents=True)
    (stats / "tx_bytes").write_text("123456\n")
    (stats / "tx_packets").write_text("100\n")
    snmp = tmp_path / "snmp"
    snmp.write_text("Ip: Forwarding\nIp: 1\nTcp: RtoAlgorithm RetransSegs InErrs\nTcp: 1 7 0\n")
    assert counters.read_counters("veth0", tmp_path / "net", snmp) == {
        "tx_bytes": 123456,
        "tx_packets": 100,
        "retrans_segs": 7,
    }


# ---------------------------------------------------------------------------------- running the nodes
def test_a_failed_node_stops_the_others_and_its_code_is_returned(tmp_path, capsys):
    """Node 0 would wait 10 minutes; node 1 fails once node 0 is up. The launcher must stop node 0 (its SIGTERM
    handler says so in the log: a node that ran to its end, or was killed outright, says nothing) and return
    node 1's code. No clock: a launcher that never stopped node 0 would hit pytest's timeout instead."""
    py, ready = sys.executable, tmp_path / "node0-ready"
    waiting = (
        f"import pathlib, signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (print('stopped by SIGTERM', flush=True), sys.exit(0)))\n"
        f"print('waiting', flush=True); pathlib.Path({str(ready)!r}).touch(); time.sleep(600)"
    )
    failing = (
        f"import pathlib, sys, time\n"
        f"while not pathlib.Path({str(ready)!r}).exists(): time.sleep(0.05)\n"
        f"print('boom', flush=True); sys.exit(3)"
    )
    cmds = [Command([py, "-c", waiting]), Command([py, "-c", failing])]
    assert node_processes.run_nodes(cmds, tmp_path / "output.log", grace_s=1.0) == 3
    log = (tmp_path / "output.log").read_text()
    assert "[node 0] waiting\n" in log and "[node 1] boom\n" in log
    assert "[node 0] stopped by SIGTERM\n" in log, log
    assert "[node 1] boom" in capsys.readouterr().out


# ------------------------------------------------------------------ real namespaces (root, iproute2)
LAUNCHER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from conftest import compose_config
    from birder_repro.config import settings as config
    from birder_repro.launch import emulated
    from birder_repro.launch.process import Command

    node_code = {node_code!r}
    def commands(cfg, run_dir, fabric, env):  # instead of torchrun: a one-liner in each namespace
        return [Command(["ip", "netns", "exec", n.netns, sys.executable, "-c", node_code],
                        {{emulated.LINK_IFACE_ENV: n.node_veth}}) for n in fabric.nodes]
    emulated.commands = commands
    cfg = config.resolve(compose_config(["cluster=emulated", "nodes=2"]), gpu_count=0)
    sys.exit(emulated.launch(cfg, {run_dir!r}))
""")
WAIT = "import time; print('up', flush=True); time.sleep(600)"
CHECK_LINK = (
    "import os; from birder_repro.netns import counters; "
    "print('counters', counters.read_counters(os.environ['BIRDER_LINK_IFACE']), flush=True)"
)


def start_launcher(tmp_path: Path, node_code: str) -> tuple[subprocess.Popen, Path]:
    run_dir = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    run_dir.mkdir()
    script = LAUNCHER.format(tests=str(TESTS), node_code=node_code, run_dir=str(run_dir))
    proc = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc, run_dir


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))
    return False


def wait_for_fabric(before: set[str], launcher: subprocess.Popen) -> str:
    """The run id of the fabric the launcher made, once both of its nodes run something (the launcher's
    children: other engineers' runs make fabrics on this machine too). No deadline (the machine is shared;
    pytest's timeout ends a hang): it fails only if the launcher ends before."""
    while launcher.poll() is None:
        for run_id in set(build.list_ours()) - before:
            pids = [build._pids_in(plan.netns_name(run_id, k)) for k in range(2)]
            if all(pids) and any(_descends_from(pid, launcher.pid) for node in pids for pid in node):
                return run_id
        time.sleep(0.2)
    raise AssertionError(
        f"the launcher ended ({launcher.returncode}) before its fabric appeared: {launcher.communicate()[0]}"
    )


def test_hosts_file_names_every_node_in_ipv4_and_ipv4_mapped_ipv6_form():
    fabric = plan.plan_fabric(2, "10.77.0.0/24", plan.Shaping(None), run_id="a1b2c3")
    lines = set(build.hosts_file(fabric, fabric.nodes[1], "vm").splitlines())
    for address, name in [
        ("127.0.0.1", "localhost"),
        ("10.77.0.2", "vm"),
        ("10.77.0.1", "bdrp-a1b2c3-0"),
        ("10.77.0.2", "bdrp-a1b2c3-1"),
    ]:
        assert {f"{address} {name}", f"::ffff:{address} {name}"} <= lines
    assert "::1 localhost" in lines


@needs_netns
def test_namespaces_name_their_nodes_without_dns():
    """c10d names the clients of its dual-stack store with getnameinfo (IPv4-mapped IPv6 addresses): each
    namespace's hosts file answers, so nothing asks a DNS server the namespace cannot reach (EAI_AGAIN, and
    c10d's "hostname of the client socket cannot be retrieved" warning)."""
    fabric = plan.plan_fabric(2, "10.77.0.0/24", plan.Shaping(None))
    build.clean_stale()
    build.create(fabric)
    try:
        for node in fabric.nodes:
            out = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    node.netns,
                    sys.executable,
                    "-c",
                    textwrap.dedent(f"""
                import socket
                for a in ("{fabric.nodes[0].address}", "{fabric.nodes[1].address}", "127.0.0.1"):
                    print(socket.getnameinfo((a, 0), 0)[0], socket.getnameinfo(("::ffff:" + a, 0, 0, 0), 0)[0])
                print(socket.getnameinfo(("::1", 0, 0, 0), 0)[0])"""),
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert out.returncode == 0, out.stderr
            names = [fabric.nodes[0].netns, fabric.nodes[1].netns]
            names[node.index] = socket.gethostname()  # each node's own address is this machine's name there
            assert out.stdout.split() == [n for n in names for _ in (0, 1)] + ["localhost"] * 3
    finally:
        assert build.destroy(fabric) == []
    assert ours(fabric.run_id) == set()
    assert not any((build.NETNS_ETC / ns).exists() for ns in fabric.namespaces)


@needs_netns
def test_links_are_shaped_and_counted_by_the_kernel():
    """200 Mbit/s both ways; the payload of a TCP transfer is tx_bytes - 66 x tx_packets exactly."""
    fabric = plan.plan_fabric(2, "10.77.0.0/24", plan.Shaping(200.0, plan.burst_bytes(200, 1.0), 100.0))
    build.clean_stale()
    build.create(fabric)
    try:
        a, b = fabric.nodes
        server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                b.netns,
                sys.executable,
                "-c",
                textwrap.dedent(f"""
            import socket
            s = socket.create_server(("{b.address}", 5001)); c, _ = s.accept(); n = 0
            while n < 5_000_000: n += len(c.recv(1 << 20))
            c.sendall(b"k")"""),
            ]
        )
        out = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                a.netns,
                sys.executable,
                "-c",
                textwrap.dedent(f"""
            import json, socket, time
            from birder_repro.netns import counters
            for _ in range(100):
                try: s = socket.create_connection(("{b.address}", 5001)); break
                except OSError: time.sleep(0.05)
            c0 = counters.read_counters("{a.node_veth}"); t = time.perf_counter()
            s.sendall(b"x" * 5_000_000); s.recv(1); dt = time.perf_counter() - t
            c1 = counters.read_counters("{a.node_veth}")
            print(json.dumps({{"mbit": 5_000_000 * 8 / dt / 1e6, "bytes": c1["tx_bytes"] - c0["tx_bytes"],
                              "packets": c1["tx_packets"] - c0["tx_packets"]}}))"""),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        server.wait(timeout=30)
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        # TCP goodput under a 200 Mbit/s bucket (1448 of 1514 bytes): never above it (unshaped veths carry Gbit/s);
        # no lower bound, which a busy shared machine could break.
        assert got["mbit"] < 200 * 1.05
        assert got["bytes"] - counters.FRAME_HEADER_BYTES * got["packets"] == pytest.approx(5_000_000, rel=1e-3)
    finally:
        assert build.destroy(fabric) == []
    assert ours(fabric.run_id) == set()


@needs_netns
def test_a_run_that_ends_leaves_nothing_and_notes_the_fabric(tmp_path):
    proc, run_dir = start_launcher(tmp_path, CHECK_LINK)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert out.count("counters {'tx_bytes'") == 2  # each node reads its own veth inside its namespace
    info = json.loads((run_dir / emulated.INFO_FILE).read_text())
    assert info["left_after_removal"] == [] and len(info["nodes"]) == 2
    assert ours(info["run_id"]) == set()


@needs_netns
def test_a_run_that_fails_leaves_nothing(tmp_path):
    proc, run_dir = start_launcher(tmp_path, "import sys; sys.exit(5)")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 5, out
    assert ours(json.loads((run_dir / emulated.INFO_FILE).read_text())["run_id"]) == set()


@needs_netns
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_run_stopped_by_a_signal_leaves_nothing(tmp_path, sig, code):
    before = set(build.list_ours())
    proc, _run_dir = start_launcher(tmp_path, WAIT)
    run_id = wait_for_fabric(before, proc)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == code, out
    assert ours(run_id) == set()


@needs_netns
def test_a_run_killed_with_sigkill_is_cleaned_by_the_next_run(tmp_path):
    before = set(build.list_ours())
    proc, _ = start_launcher(tmp_path, WAIT)
    run_id = wait_for_fabric(before, proc)
    node_pids = [pid for k in range(2) for pid in build._pids_in(plan.netns_name(run_id, k))]
    proc.kill()
    proc.wait(timeout=30)
    assert ours(run_id), "SIGKILL leaves the fabric behind: nothing could remove it"
    # The nodes got SIGTERM from the kernel when the launcher died (PR_SET_PDEATHSIG): they end. No deadline
    # here (pytest's timeout ends a node that never does).
    while any(Path(f"/proc/{pid}").exists() for pid in node_pids):
        time.sleep(0.1)
    nxt, next_dir = start_launcher(tmp_path, CHECK_LINK)
    out, _ = nxt.communicate(timeout=120)
    # The next run on this machine removes it: ours, which says so, or another engineer's that started first
    # (the machine is shared), which then leaves ours nothing to remove. Either way it is gone.
    assert nxt.returncode == 0, out
    assert f"removed the emulated cluster(s) {run_id}" in out or run_id not in build.list_ours(), out
    assert ours(run_id) == set()
    assert ours(json.loads((next_dir / emulated.INFO_FILE).read_text())["run_id"]) == set()
    assert not [
        n
        for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        if n.startswith(f"{plan.PREFIX}-{run_id}")
    ]


@needs_netns
def test_a_live_run_is_not_taken_for_a_stale_one(tmp_path):
    before = set(build.list_ours())
    proc, _ = start_launcher(tmp_path, WAIT)
    try:
        run_id = wait_for_fabric(before, proc)
        assert run_id not in build.clean_stale()
        assert plan.netns_name(run_id, 0) in build.list_ours()[run_id]
    finally:
        proc.terminate()
        proc.communicate(timeout=120)
    assert ours(run_id) == set()


# ------------------------------------------------------------------------------- real training (slow)
def birder_repro(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "birder_repro.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def records(runs: Path) -> list[dict]:
    return [record.read_record(p.parent) for p in sorted(runs.rglob(record.RECORD_FILE))]


def check_link_bytes_match_the_hook(compose, runs_dir, overrides: list[str]) -> None:
    """Two nodes through the CLI: the kernel's payload (tx_bytes - 66 x packets) of each node's link within
    10 % of what the run sends: the hook's count, and nothing else (the runner's DDP broadcasts no buffers
    before its forward passes: birder_repro.train.parallel)."""
    out = birder_repro(*overrides)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (rec,) = records(runs_dir)
    assert rec["status"] == "completed" and len(rec["link_bytes_per_step"]) == 2
    hook = rec["inter_node_bytes_per_step"]  # per process = per node (1 process a node)
    for node, (sent, packets) in enumerate(zip(rec["link_bytes_per_step"], rec["link_packets_per_step"])):
        payload = sent - counters.FRAME_HEADER_BYTES * packets
        assert payload == pytest.approx(hook, rel=0.10), (node, payload, hook)
    info = json.loads((Path(rec["run_dir"]) / emulated.INFO_FILE).read_text())
    assert ours(info["run_id"]) == set()


@needs_netns
def test_emulated_link_bytes_match_the_hooks_count(compose, runs_dir):
    """The fast version (default run): SGDM on digits (30,762 parameters: 92 kB per process per step through
    the link, 2.3 kB of BatchNorm buffers), 6 steps on 2 nodes of one process."""
    check_link_bytes_match_the_hook(
        compose,
        runs_dir,
        [
            "cluster=emulated",
            "nodes=2",
            "gpus_per_node=1",
            "task=digits",
            "optim=sgdm",
            "logger=none",
            "train.steps=6",
            "train.timing_warmup_steps=2",
            "train.eval=false",
            "cluster.link_mbit=200",
        ],
    )


@pytest.mark.slow
@needs_netns
@pytest.mark.parametrize("optim", ["sgdm", "birder"])
def test_emulated_run_counts_the_bytes_the_hook_sends(compose, runs_dir, optim):
    """ResNet-20 (0.27M parameters: SGDM sends 1.1 MB per step per node, Birder 34 kB; buffers 5.6 kB)."""
    check_link_bytes_match_the_hook(
        compose,
        runs_dir,
        [
            "cluster=emulated",
            "nodes=2",
            f"optim={optim}",
            *TINY,
            "model.size=full",
            "train.steps=12",
            "train.timing_warmup_steps=2",
        ],
    )


@pytest.mark.slow
@needs_netns
def test_an_emulated_sweep_records_a_failed_cell_and_runs_the_others(runs_dir):
    """One cell fails in its workers (a checkpoint of another task to resume from: complete on disk, so the CLI
    takes it; the workers refuse it), the other completes; both recorded, nothing left. (A missing dataset or
    checkpoint would not do: the CLI refuses those before it makes any namespace.)"""
    other = runs_dir.parent / "other-task" / "checkpoints" / "step-000001"
    other.mkdir(parents=True)
    (other / "manifest.json").write_text(json.dumps({"step": 1, "task": "lstm_ptb", "files": []}))
    (other / "COMPLETE").write_text(json.dumps({"step": 1}))
    out = birder_repro("-m", "cluster=emulated", "nodes=2", *TINY, "train.steps=4", f"train.resume=null,{other}")
    # the sweep as a whole failed (birder_repro.sweep: exit 1 where any cell failed), its failed cell listed last
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "lstm_ptb" in out.stderr.splitlines()[-1], out.stderr[-3000:]
    recs = records(runs_dir)
    assert [r["status"] for r in recs] == ["completed", "failed"]
    assert "lstm_ptb" in recs[1]["error"], recs[1]["error"]
    for r in recs:
        info = json.loads((Path(r["run_dir"]) / emulated.INFO_FILE).read_text())
        assert info["left_after_removal"] == [] and ours(info["run_id"]) == set()


@pytest.mark.slow
@needs_netns
def test_an_emulated_run_stopped_by_sigterm_checkpoints_and_resumes_in_place(runs_dir):
    """SIGTERM to the launcher while rank 0 holds before step 4 (BIRDER_TEST_FAULT=wait): every node's CLI passes
    it on, the workers save step 3 and record the run interrupted, the fabric goes; the user's command with the
    run directory resumes it there, through new node CLIs, and completes."""
    args = [
        "cluster=emulated",
        "nodes=2",
        "gpus_per_node=1",
        "task=digits",
        "optim=sgdm",
        "logger=none",
        "model.size=tiny",
        "train.steps=8",
        "train.batch_size=8",
        "train.eval_max_batches=1",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "BIRDER_TEST_FAULT": "wait:0:4"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "birder_repro.cli", *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    progress = None
    while progress is None or json.loads(progress.read_text() or "{}").get("step", 0) < 3:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        progress = next(iter(runs_dir.rglob("progress.json")), None)
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 143, out[-3000:]
    run_dir = progress.parent
    rec = record.read_record(run_dir)
    assert rec["status"] == "interrupted" and rec["stopped_at_step"] == 3, rec.get("error")
    assert rec["command"] == record.format_command(["birder-repro", *args])  # the user's, not a node's
    assert rec["resume_command"] == record.resume_command(run_dir) and "launcher=torchrun" not in rec["error"]
    assert out.strip().endswith(f"resume: {rec['resume_command']}"), out[-2000:]
    assert ours(json.loads((run_dir / emulated.INFO_FILE).read_text())["run_id"]) == set()
    again = birder_repro(*args, f"hydra.run.dir={run_dir}")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    rec = record.read_record(run_dir)
    assert rec["status"] == "completed" and rec["steps"] == 8 and len(rec["link_bytes_per_step"]) == 2
    assert [(a["status"], a["to_step"]) for a in rec["attempts"]] == [("interrupted", 3), ("completed", 8)]


def test_cli_refusal_of_emulated_with_another_launcher_is_recorded(compose, tmp_path):
    cfg = compose(["cluster=emulated", "launcher=torchrun", "logger=none"], hydra_config=True)
    assert cli.run(cfg, run_dir=tmp_path / "run") != 0
    rec = record.read_record(tmp_path / "run")
    assert rec["status"] == "failed" and "launcher=auto" in rec["error"]
