"""The network-namespace testbed: built, shaped, run in, and always torn down (needs root)."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from testbench import ConfigError
from testbench.testbed import Testbed, TestbedConfig, TestbedError, available, cleanup_stale

OK, WHY = available()
pytestmark = [pytest.mark.netns, pytest.mark.slow,
              pytest.mark.skipif(not OK, reason=f"testbed unavailable: {WHY}")]


def _namespaces():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _host_links():
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip() for line in out.splitlines())


def _host_addrs():
    out = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
    return sorted(" ".join(line.split()[1:4]) for line in out.splitlines())


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="hosts"):
        TestbedConfig(hosts=0)
    with pytest.raises(ConfigError, match="rate"):
        TestbedConfig(rate=-5)
    with pytest.raises(ConfigError, match="subnet"):
        TestbedConfig(subnet="192.168.1")
    with pytest.raises(ConfigError, match="shaper"):
        TestbedConfig(shaper="netem")


SERVER_CLIENT = textwrap.dedent("""
    import os, socket, sys, time
    rank, n = int(os.environ["RANK"]), int(sys.argv[1])
    if rank == 0:
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((os.environ["MASTER_ADDR"], 5601)); s.listen(1)
        c, _ = s.accept(); got = 0; t0 = None
        while got < n:
            b = c.recv(1 << 20)
            if not b: break
            t0 = t0 or time.monotonic(); got += len(b)
        print(got / (time.monotonic() - t0))
    else:
        for _ in range(100):
            try:
                s = socket.create_connection((os.environ["MASTER_ADDR"], 5601)); break
            except OSError:
                time.sleep(0.05)
        s.sendall(b"x" * n); s.close()
""")


@pytest.mark.parametrize("shaper", ["tbf", "htb"])
def test_build_shape_run_and_tear_down(shaper):
    before_ns, before_links, before_addrs = _namespaces(), _host_links(), _host_addrs()
    rate = 25e6
    with Testbed(TestbedConfig(hosts=2, rate=rate, shaper=shaper)) as tb:
        assert set(tb.namespaces) | {tb.bridge} <= _namespaces()
        assert tb.addresses == ["10.213.0.1", "10.213.0.2"]
        # the host's own namespace is untouched: no new links, no new addresses
        assert _host_links() == before_links and _host_addrs() == before_addrs
        qdisc = subprocess.run(["ip", "netns", "exec", tb.namespaces[1], "tc", "qdisc", "show",
                                "dev", "eth0"], capture_output=True, text=True).stdout
        assert shaper in qdisc and ("200Mbit" in qdisc or shaper == "htb")
        # 1.2 s of data at the shaped rate: the receiver sees the rate, not loopback speed
        res = tb.run([sys.executable, "-c", SERVER_CLIENT, str(int(rate * 1.2))], timeout_s=30)
        assert all(r.returncode == 0 for r in res), [r.stderr for r in res]
        measured = float(res[0].stdout.strip())
        assert 0.85 * rate < measured < 1.1 * rate
        env = tb.rank_env(1)
        assert env["MASTER_ADDR"] == "10.213.0.1" and env["RANK"] == "1"
    assert _namespaces() == before_ns
    assert _host_links() == before_links


def test_torn_down_when_the_body_raises():
    before = _namespaces()
    tb = Testbed(TestbedConfig(hosts=2))
    with pytest.raises(RuntimeError, match="boom"):
        with tb:
            assert tb.namespaces[0] in _namespaces()
            raise RuntimeError("boom")
    assert _namespaces() == before and not tb.is_up


def test_run_is_bounded_by_its_timeout():
    with Testbed(TestbedConfig(hosts=2)) as tb:
        t0 = time.monotonic()
        res = tb.run(["sleep", "30"], timeout_s=1.0)
        assert time.monotonic() - t0 < 10
        assert all(r.timed_out and r.returncode != 0 for r in res)
        with pytest.raises(ConfigError, match="timeout_s"):
            tb.run(["true"], timeout_s=0)
    with pytest.raises(TestbedError, match="not up"):
        tb.run(["true"], timeout_s=1)


def test_sigterm_and_sigint_tear_down(tmp_path):
    prog = textwrap.dedent("""
        import sys, time
        from testbench.testbed import Testbed, TestbedConfig
        tb = Testbed(TestbedConfig(hosts=2, prefix=sys.argv[1])).up()
        print("up", flush=True)
        time.sleep(60)
    """)
    for sig in (signal.SIGTERM, signal.SIGINT):
        prefix = f"qsgdtbsig{os.getpid()}{int(sig)}"
        # a suite started in the background (`make test &`) ignores SIGINT, and so would the
        # child (Python then installs no KeyboardInterrupt handler): give it the default back
        p = subprocess.Popen([sys.executable, "-c", prog, prefix], stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            assert p.stdout.readline().strip() == "up"
            assert any(n.startswith(prefix) for n in _namespaces())
            p.send_signal(sig)
            p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
        assert not any(n.startswith(prefix) for n in _namespaces()), sig


def test_cleanup_stale_removes_only_dead_owners():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"qsgdtb{dead.pid}-h0"
    live = f"qsgdtb{os.getpid()}-stalecheck"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    subprocess.run(["ip", "netns", "add", live], check=True)
    try:
        removed = cleanup_stale()
        assert stale in removed and live not in removed
        assert live in _namespaces() and stale not in _namespaces()
    finally:
        for ns in (stale, live):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_script_runs_a_command_per_host():
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "testbed.py")
    r = subprocess.run([sys.executable, script, "run", "--hosts", "3", "--rate", "100Mbit",
                        "--timeout", "30", "--", "sh", "-c", "echo rank=$RANK of $WORLD_SIZE"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [l for l in r.stdout.splitlines() if l.startswith("rank=")] == [
        "rank=0 of 3", "rank=1 of 3", "rank=2 of 3"]
    r = subprocess.run([sys.executable, script, "run", "--hosts", "2", "--", "false"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "exit 1" in r.stdout
