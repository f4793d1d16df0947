"""A multi-host testbed on one machine: network namespaces, a bridge, veth pairs and ``tc``.

Each emulated host is a Linux network namespace with one interface ``eth0`` (a veth pair
whose other end sits in a separate *bridge* namespace and is enslaved to a Linux bridge
there), so ranks talk over a real TCP/IP stack through one switch. Every link is shaped in
both directions with a token bucket (``tc qdisc ... tbf``): on the host's ``eth0`` (its
egress, the upload) and on the bridge port (the switch's egress towards the host, the
download), which matches the emulator's full-duplex link model (`topologies.switch`: one
link per host with the same bandwidth each way). netem (added delay) is not available in
this kernel, so latency is what the stack and the bridge give.

Only namespaces created here are touched: the veth pairs are created *inside* the bridge
namespace (``ip -n BR link add ... peer ... netns H``), so nothing appears in the host's own
namespace, and the 10.x addresses exist only inside the new namespaces. Names carry a
per-run prefix (``qsgdtb<pid>``) so concurrent runs never collide; everything is torn down in
``finally``, on ``atexit`` and on SIGINT/SIGTERM. Needs root and ``ip``/``tc`` (iproute2).

Example
-------
>>> with Testbed(TestbedConfig(hosts=4, rate=parse_bandwidth("1Gbit"))) as tb:  # doctest: +SKIP
...     results = tb.run(["python", "-m", "testbench.harness", ...], timeout_s=120)
"""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass

from .errors import ConfigError, TestbedError
from .processes import RankResult, kill_group
from ._checks import is_int

__all__ = ["TestbedConfig", "Testbed", "RankResult", "TestbedError", "available", "cleanup_stale"]

_NS_PREFIX = "qsgdtb"


@dataclass(frozen=True)
class TestbedConfig:
    """What to build.

    Parameters
    ----------
    hosts : int
        Number of emulated hosts (namespaces), 1..200.
    rate : float or None
        Shaped rate of every host link, bytes/s, in each direction; None leaves links unshaped.
    subnet : str
        First three octets of the /24 used inside the namespaces; host ``i`` gets ``.{i+1}``.
    prefix : str or None
        Namespace name prefix; default ``qsgdtb<pid>``, unique per process.
    burst : int or None
        Token-bucket size in bytes; default ``max(64 KiB, 2 ms of rate)``. It must hold at least
        one timer tick of data at the rate, and a segmented TSO super-packet.
    queue_latency_s : float
        Longest time a packet may wait in the shaper queue (tbf ``latency``), seconds. A
        long queue delays the ACKs that share it with data (bufferbloat) and slows every
        TCP flow that is not alone, a short one drops packets; 50 ms measured best here.
    mtu : int
        Interface MTU, bytes. Jumbo frames (9000, as in datacentre Ethernet) cut the packet
        rate six-fold: with 1500-byte frames on 2 busy cores, a 4-host ring reached only
        60-75% of a 200 Mbit/s shaped rate with +-15% noise; with 9000 it reaches 95%.
    sysctls : tuple of (key, value)
        Set inside every host namespace (see :meth:`Testbed._tune_tcp`).
    shaper : str
        A key of :data:`SHAPERS`: ``"tbf"`` (token bucket) or ``"htb"`` (htb + pfifo).
    shape_ingress : bool
        Also shape the bridge port towards each host (the download direction).
    """

    __test__ = False

    hosts: int = 2
    rate: float | None = None
    subnet: str = "10.213.0"
    prefix: str | None = None
    burst: int | None = None
    queue_latency_s: float = 0.05
    mtu: int = 9000
    sysctls: tuple = (("net.ipv4.tcp_slow_start_after_idle", "0"),)
    shaper: str = "tbf"
    shape_ingress: bool = True

    def __post_init__(self):
        if not is_int(self.hosts) or not 1 <= self.hosts <= 200:
            raise ConfigError(f"hosts {self.hosts!r} must be an integer in 1..200")
        if self.rate is not None and not (isinstance(self.rate, (int, float)) and self.rate > 0):
            raise ConfigError(f"rate {self.rate!r} must be a positive number of bytes/s or None")
        octets = self.subnet.split(".")
        if len(octets) != 3 or not all(o.isdigit() and 0 <= int(o) <= 255 for o in octets) \
                or octets[0] != "10":
            raise ConfigError(f"subnet {self.subnet!r} must be three octets of a 10.x.y.0/24, "
                              "e.g. '10.213.0'")
        if self.prefix is not None and (not self.prefix.isalnum() or len(self.prefix) > 40):
            raise ConfigError(f"prefix {self.prefix!r} must be alphanumeric, at most 40 characters")
        if self.burst is not None and (not isinstance(self.burst, int) or self.burst < 3000):
            raise ConfigError(f"burst {self.burst!r} must be an integer of at least 3000 bytes")
        if not self.queue_latency_s > 0:
            raise ConfigError(f"queue_latency_s {self.queue_latency_s!r} must be > 0 seconds")
        if self.shaper not in SHAPERS:
            raise ConfigError(f"shaper {self.shaper!r} not one of {', '.join(SHAPERS)}")
        if not 576 <= self.mtu <= 65535:
            raise ConfigError(f"mtu {self.mtu!r} must be in 576..65535 bytes")

    def tbf_burst(self) -> int:
        """Bucket size in bytes used for the tbf shapers."""
        if self.burst is not None:
            return self.burst
        return int(max(64 * 1024, (self.rate or 0) * 0.002))


def available() -> tuple[bool, str]:
    """Whether a testbed can be built here: ``(True, "")`` or ``(False, reason)``."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "network namespaces need root (euid 0)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"'{tool}' (iproute2) is not installed"
    probe = f"{_NS_PREFIX}{os.getpid()}probe"
    try:
        r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            return False, f"'ip netns add' failed: {r.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"'ip netns add' failed: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return True, ""


def _list_namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def cleanup_stale() -> list[str]:
    """Delete testbed namespaces left by dead processes (``qsgdtb<pid>...`` whose pid is gone).

    Returns the names deleted. Namespaces of live processes are left alone.
    """
    removed = []
    for ns in _list_namespaces():
        if not ns.startswith(_NS_PREFIX):
            continue
        digits = ""
        for ch in ns[len(_NS_PREFIX):]:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            continue
        try:
            os.kill(int(digits), 0)
            continue  # owner alive
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
        removed.append(ns)
    return removed


def _tbf(dev: str, cfg: "TestbedConfig") -> list[list[str]]:
    """One token bucket (tc-tbf(8)): rate in bit/s, bucket in bytes, queue bounded by latency."""
    return [["qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{int(round(cfg.rate * 8))}bit",
             "burst", str(cfg.tbf_burst()), "latency", f"{cfg.queue_latency_s * 1e3:.3f}ms"]]


def _htb(dev: str, cfg: "TestbedConfig") -> list[list[str]]:
    """An htb class at the rate (tc-htb(8)) with a pfifo leaf holding ``queue_latency_s`` of data.

    (fq_codel would keep ACKs out of the data queue, but this kernel has no sch_fq_codel; pfifo
    and htb are what it offers besides tbf.)
    """
    bits = f"{int(round(cfg.rate * 8))}bit"
    burst = str(cfg.tbf_burst())
    packets = max(10, int(cfg.rate * cfg.queue_latency_s / cfg.mtu))
    return [["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "10"],
            ["class", "add", "dev", dev, "parent", "1:", "classid", "1:10", "htb", "rate", bits,
             "ceil", bits, "burst", burst, "cburst", burst],
            ["qdisc", "add", "dev", dev, "parent", "1:10", "handle", "10:", "pfifo",
             "limit", str(packets)]]


#: shaper name -> commands (``tc`` argv tails) that shape ``dev`` at ``cfg.rate``.
SHAPERS = {"tbf": _tbf, "htb": _htb}


_LIVE: "weakref.WeakSet[Testbed]" = weakref.WeakSet()
_HANDLERS_INSTALLED = False


def _teardown_all():
    for tb in list(_LIVE):
        tb.down()


def _install_handlers():
    """Tear down on interpreter exit and turn SIGTERM into SystemExit so ``finally`` runs."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    _HANDLERS_INSTALLED = True
    atexit.register(_teardown_all)
    if threading_main():
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum, frame):
            _teardown_all()
            if callable(previous):
                previous(signum, frame)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, on_term)
        # SIGINT already raises KeyboardInterrupt, which unwinds through ``finally``/``__exit__``.


def threading_main() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


class Testbed:
    """N hosts joined by one shaped switch, each host a network namespace.

    Use as a context manager (or call :meth:`up` and :meth:`down`). Attributes after
    :meth:`up`: ``namespaces`` (host namespace names, rank order), ``addresses`` (their IPv4
    addresses), ``bridge`` (the bridge namespace), ``interface`` (``"eth0"``).
    """

    interface = "eth0"
    __test__ = False

    def __init__(self, config: TestbedConfig | None = None, **kwargs):
        self.config = config if config is not None else TestbedConfig(**kwargs)
        prefix = self.config.prefix or f"{_NS_PREFIX}{os.getpid()}"
        self.prefix = prefix
        self.bridge = f"{prefix}-br"
        self.namespaces = [f"{prefix}-h{i}" for i in range(self.config.hosts)]
        self.addresses = [f"{self.config.subnet}.{i + 1}" for i in range(self.config.hosts)]
        self._created: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self.is_up = False

    # -- building ---------------------------------------------------------------------------
    def _ip(self, *args: str, ns: str | None = None):
        cmd = ["ip"] + (["-n", ns] if ns else []) + list(args)
        self._sh(cmd)

    def _sh(self, cmd: list[str]):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"command timed out: {' '.join(cmd)}") from None
        if r.returncode != 0:
            raise TestbedError(f"command failed ({r.returncode}): {' '.join(cmd)}: {r.stderr.strip()}")

    def _shape(self, ns: str, dev: str):
        if self.config.rate is None:
            return
        for cmd in SHAPERS[self.config.shaper](dev, self.config):
            self._sh(["ip", "netns", "exec", ns, "tc", *cmd])

    def _tune_tcp(self, ns: str):
        """Per-namespace TCP settings (net.ipv4 sysctls are per network namespace).

        A collective sends one message per step with idle gaps between; Linux restarts the
        congestion window after an idle RTO (tcp_slow_start_after_idle), which on a shaped
        link with a queue makes every step ramp up again. Datacentre stacks and RDMA NICs
        do not pay that, and the emulator does not model it, so it is off here.
        """
        for key, value in self.config.sysctls:
            self._sh(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", f"{key}={value}"])

    def up(self) -> "Testbed":
        """Create namespaces, bridge, veth pairs, addresses and shapers. Idempotent."""
        if self.is_up:
            return self
        ok, reason = available()
        if not ok:
            raise TestbedError(f"testbed not available: {reason}")
        _install_handlers()
        _LIVE.add(self)
        existing = set(_list_namespaces())
        clash = [n for n in [self.bridge, *self.namespaces] if n in existing]
        if clash:
            raise TestbedError(f"namespace {clash[0]!r} already exists (another run with prefix "
                               f"{self.prefix!r}?); remove it or choose another prefix")
        try:
            for ns in [self.bridge, *self.namespaces]:
                self._sh(["ip", "netns", "add", ns])
                self._created.append(ns)
                self._ip("link", "set", "lo", "up", ns=ns)
                if ns != self.bridge:
                    self._tune_tcp(ns)
            self._ip("link", "add", "br0", "type", "bridge", ns=self.bridge)
            self._ip("link", "set", "br0", "up", ns=self.bridge)
            mtu = str(self.config.mtu)
            for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
                port = f"p{i}"
                # Both ends are born inside namespaces of ours: nothing shows in the host's.
                self._ip("link", "add", port, "mtu", mtu, "type", "veth", "peer", "name",
                         self.interface, "mtu", mtu, "netns", ns, ns=self.bridge)
                self._ip("link", "set", port, "master", "br0", ns=self.bridge)
                self._ip("link", "set", port, "up", ns=self.bridge)
                self._ip("addr", "add", f"{addr}/24", "dev", self.interface, ns=ns)
                self._ip("link", "set", self.interface, "up", ns=ns)
                self._shape(ns, self.interface)        # host -> switch
                if self.config.shape_ingress:
                    self._shape(self.bridge, port)     # switch -> host
            self.is_up = True
            self._wait_reachable()
        except BaseException:
            self.down()
            raise
        return self

    def _wait_reachable(self, timeout_s: float = 10.0):
        """Wait until host 0 answers a ping from every other host (bridge ports need a moment)."""
        if len(self.namespaces) < 2 or shutil.which("ping") is None:
            time.sleep(0.2)
            return
        deadline = time.monotonic() + timeout_s
        for ns in self.namespaces[1:]:
            while True:
                r = subprocess.run(["ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "1",
                                    self.addresses[0]], capture_output=True, timeout=5)
                if r.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise TestbedError(f"host {ns} cannot reach {self.addresses[0]} within "
                                       f"{timeout_s} s")
                time.sleep(0.1)

    def down(self):
        """Kill ranks still running and delete every namespace this testbed created."""
        for p in self._procs:
            kill_group(p)
        self._procs.clear()
        for ns in reversed(self._created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        self._created.clear()
        self.is_up = False
        _LIVE.discard(self)

    def __enter__(self):
        return self.up()

    def __exit__(self, *exc):
        self.down()
        return False

    # -- running ----------------------------------------------------------------------------
    def command(self, rank: int, argv: list[str]) -> list[str]:
        """The argv that runs ``argv`` inside host ``rank``'s namespace."""
        if not 0 <= rank < len(self.namespaces):
            raise ConfigError(f"rank {rank!r} not in 0..{len(self.namespaces) - 1}")
        return ["ip", "netns", "exec", self.namespaces[rank], *argv]

    def rank_env(self, rank: int, port: int = 29500) -> dict[str, str]:
        """torch.distributed ``env://`` variables for ``rank``, MASTER_ADDR = host 0's address."""
        return {
            "RANK": str(rank), "WORLD_SIZE": str(len(self.namespaces)), "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": self.addresses[0], "MASTER_PORT": str(port),
            # gloo binds to the interface named here; only eth0 leads to the other hosts.
            "GLOO_SOCKET_IFNAME": self.interface, "QSGD_TESTBED_HOST": f"h{rank}",
        }

    def run(self, argv, *, timeout_s: float, env: dict | None = None, port: int = 29500,
            cwd: str | None = None) -> list[RankResult]:
        """Run one process per host, all at once, and wait for all of them (bounded).

        Parameters
        ----------
        argv : list[str] or callable(rank) -> list[str]
            The command of each rank (run inside its namespace with :meth:`rank_env` added).
        timeout_s : float
            Wall-clock bound, seconds, for the whole group; on expiry every rank is killed
            and its result has ``timed_out=True``.
        """
        if not self.is_up:
            raise TestbedError("testbed is not up; call up() or use it as a context manager")
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s {timeout_s!r} must be > 0 seconds")
        outdir = tempfile.mkdtemp(prefix="qsgdtb-out-")
        files, starts = [], []
        try:
            for rank in range(len(self.namespaces)):
                cmd = argv(rank) if callable(argv) else list(argv)
                e = dict(os.environ)
                e.update(env or {})
                e.update(self.rank_env(rank, port))
                out = open(os.path.join(outdir, f"{rank}.out"), "w+")
                err = open(os.path.join(outdir, f"{rank}.err"), "w+")
                files.append((out, err))
                starts.append(time.monotonic())
                self._procs.append(subprocess.Popen(self.command(rank, cmd), stdout=out, stderr=err,
                                                    env=e, cwd=cwd, start_new_session=True))
            deadline = time.monotonic() + timeout_s
            results: list[RankResult | None] = [None] * len(self._procs)
            timed_out = False
            while any(r is None for r in results):
                for i, p in enumerate(self._procs):
                    if results[i] is None and p.poll() is not None:
                        results[i] = self._result(i, p, files[i], starts[i], False)
                if time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.05)
            if timed_out:
                for i, p in enumerate(self._procs):
                    if results[i] is None:
                        kill_group(p)
                        results[i] = self._result(i, p, files[i], starts[i], True)
            return results  # type: ignore[return-value]
        finally:
            for p in self._procs:
                kill_group(p)
            self._procs.clear()
            for out, err in files:
                out.close()
                err.close()
            shutil.rmtree(outdir, ignore_errors=True)

    @staticmethod
    def _result(rank, proc, files, start, timed_out) -> RankResult:
        out, err = files
        out.flush()
        err.flush()
        out.seek(0)
        err.seek(0)
        return RankResult(rank=rank, returncode=proc.returncode, stdout=out.read(),
                          stderr=err.read(), wall_s=time.monotonic() - start, timed_out=timed_out)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use scripts/testbed.py or `qsgd-emu validate testbed`")
