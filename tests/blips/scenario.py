"""The blip scenario under load, printed as JSON: network cuts through a proxy, or an acker killed and restarted.

Three acker processes on loopback (``acker_service.process_cluster.ProcessCluster``); the spout's connections
pass through one :class:`~tests.blips.proxy.BlipProxy` per acker, the bolts'
connections directly or through proxies of their own (``--side``). A steady
workload (:mod:`tests.blips.workload`) runs while the scenario breaks things:

    .venv/bin/python -m tests.blips.scenario --mode cuts --cuts 3 --seconds 3
    .venv/bin/python -m tests.blips.scenario --mode restart --seconds 3
    .venv/bin/python -m tests.blips.scenario --mode kills --kills 7 --every 10 --seconds 2 \
        --rate 300 --hold 1 --message-timeout 5 --replicas 1,2

``--mode kills`` kill -9s one acker (shards in turn) every ``--every`` seconds and
restarts it ``--seconds`` later; with ``--replicas 1,2`` it runs once per
replication factor on a fresh cluster and prints both runs' figures, the
ackers' memory sampled once a second, and the spout's throughput.

The blip suite (``tests/blips/test_blips.py``) runs smaller cases of the same
functions in-process; this script is for before/after figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from acker_client import ClusterClient

from .proxy import BlipProxy
from .workload import Workload, WorkloadConfig

__all__ = ["run_cuts", "run_restart", "run_kills", "proxies"]


@contextlib.contextmanager
def proxies(addresses: list[str]) -> Iterator[list[BlipProxy]]:
    """One started proxy per address, closed on exit."""
    started = [BlipProxy(a).start() for a in addresses]
    try:
        yield started
    finally:
        for proxy in started:
            proxy.close()


def _client(addresses: list[str], client_options: dict[str, Any]) -> ClusterClient:
    return ClusterClient(addresses, **client_options)


def run_cuts(
    addresses: list[str],
    *,
    cuts: int = 3,
    seconds: float = 3.0,
    gap: float = 3.0,
    side: str = "spout",
    workload: WorkloadConfig = WorkloadConfig(),
    client_options: dict[str, Any] | None = None,
    spout_options: dict[str, Any] | None = None,
    drain_timeout: float = 60.0,
    fault: str = "cut",
) -> dict[str, Any]:
    """Run the workload against ``addresses`` and break the ``side`` ("spout", "bolt", "both") ``cuts`` times."""
    client_options = client_options or {}
    with proxies(addresses) as spout_proxies, proxies(addresses) as bolt_proxies:
        spout_addresses = [p.address for p in spout_proxies]
        bolt_addresses = [p.address for p in bolt_proxies] if side in ("bolt", "both") else addresses
        broken = (spout_proxies if side in ("spout", "both") else []) + (
            bolt_proxies if side in ("bolt", "both") else []
        )
        with _client(spout_addresses, client_options) as spout_client, _client(bolt_addresses, client_options) as bolt:
            load = Workload(spout_client, bolt, workload, **(spout_options or {})).start()
            started = time.monotonic()
            time.sleep(gap)
            for _ in range(cuts):
                for proxy in broken:
                    if fault == "half_open":
                        proxy.half_open(seconds)
                    else:
                        proxy.cut(seconds)
                time.sleep(seconds + gap)
            emitting = time.monotonic() - started
            drained = load.stop(drain_timeout)
            result = load.report()
            # Connections the clients opened while a cut refused them: the cut reached them.
            result["refused_connections"] = sum(proxy.refused for proxy in broken)
    outage = cuts * seconds
    result.update(
        mode=fault,
        side=side,
        cuts=cuts,
        cut_seconds=seconds,
        emitting_seconds=round(emitting, 1),
        drained=drained,
        outage_seconds=outage,
        completed_replayed_per_outage_second=round(result["completed_but_replayed"] / outage, 1) if outage else 0,
        replayed_per_outage_second=round(result["replayed"] / outage, 1) if outage else 0,
    )
    return result


def run_restart(
    cluster,
    *,
    shard: int = 1,
    seconds: float = 3.0,
    gap: float = 3.0,
    workload: WorkloadConfig = WorkloadConfig(),
    client_options: dict[str, Any] | None = None,
    drain_timeout: float = 60.0,
) -> dict[str, Any]:
    """Run the workload against a ``acker_service.process_cluster.ProcessCluster``; kill -9 ``shard``, restart it on the same port ``seconds`` later."""
    client_options = client_options or {}
    addresses = cluster.addresses
    with _client(addresses, client_options) as spout_client, _client(addresses, client_options) as bolt:
        load = Workload(spout_client, bolt, workload).start()
        started = time.monotonic()
        time.sleep(gap)
        load_before_kill = load.emitted
        cluster.kill(shard, signal.SIGKILL)
        time.sleep(seconds)
        cluster.restart(shard)
        restarted_at = load.emitted
        time.sleep(gap)
        emitting = time.monotonic() - started
        drained = load.stop(drain_timeout)
        result = load.report()
    result.update(
        mode="restart",
        killed_shard=shard,
        down_seconds=seconds,
        emitting_seconds=round(emitting, 1),
        emitted_before_kill=load_before_kill,
        emitted_while_down=restarted_at - load_before_kill,
        drained=drained,
    )
    return result


class _RssSampler:
    """Samples the summed resident memory of a ProcessCluster's ackers once a second, in a thread."""

    def __init__(self, cluster) -> None:
        self.cluster = cluster
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def __enter__(self) -> _RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            self.samples.append(sum(_rss(self.cluster.pid(i)) for i in range(self.cluster.count)))

    def figures(self) -> dict[str, int]:
        """Peak and mean of the summed RSS, bytes."""
        if not self.samples:
            return {}
        return {
            "ackers_rss_peak_bytes": max(self.samples),
            "ackers_rss_mean_bytes": sum(self.samples) // len(self.samples),
        }


def _rss(pid: int | None) -> int:
    """A process's resident set size in bytes (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def run_kills(
    cluster,
    *,
    kills: int = 7,
    every: float = 10.0,
    down: float = 2.0,
    workload: WorkloadConfig = WorkloadConfig(),
    client_options: dict[str, Any] | None = None,
    drain_timeout: float = 120.0,
) -> dict[str, Any]:
    """Run the workload against a ProcessCluster and kill -9 one acker (shards in turn) every ``every`` seconds,
    restarting it ``down`` seconds later; the figures, with the ackers' memory and the spout's throughput."""
    client_options = client_options or {}
    addresses = cluster.addresses
    with (
        _client(addresses, client_options) as spout_client,
        _client(addresses, client_options) as bolt,
        _RssSampler(cluster) as rss,
    ):
        load = Workload(spout_client, bolt, workload).start()
        started = time.monotonic()
        for kill in range(kills):
            time.sleep(max(0.0, started + (kill + 1) * every - down - time.monotonic()))
            cluster.kill(kill % cluster.count, signal.SIGKILL)
            time.sleep(down)
            cluster.restart(kill % cluster.count)
        time.sleep(every - down)
        emitting = time.monotonic() - started
        drained = load.stop(drain_timeout)
        result = load.report()
    result.update(rss.figures())
    result.update(
        mode="kills",
        replicas=spout_client.replicas,
        kills=kills,
        every_seconds=every,
        down_seconds=down,
        emitting_seconds=round(emitting, 1),
        acked_per_second=round(result["acked"] / emitting, 1),
        drained=drained,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line: run one scenario on a fresh 3-process cluster and print its figures as JSON."""
    from acker_service.process_cluster import ProcessCluster

    p = argparse.ArgumentParser(prog="python -m tests.blips.scenario", description=__doc__)
    p.add_argument("--mode", choices=("cuts", "half_open", "restart", "kills"), default="cuts")
    p.add_argument("--kills", type=int, default=7, help="kills mode: how many kill -9s")
    p.add_argument("--every", type=float, default=10.0, help="kills mode: seconds between kills")
    p.add_argument("--hold", type=float, default=0.0, help="seconds each tree stays in flight before the bolts ack it")
    p.add_argument(
        "--replicas", default="1", help="the ackers' --replicas; a list such as 1,2 runs once per factor (kills mode)"
    )
    p.add_argument("--cuts", type=int, default=3)
    p.add_argument("--seconds", type=float, default=3.0, help="length of each cut / time the acker stays down")
    p.add_argument("--gap", type=float, default=3.0, help="seconds of healthy network before, between, after")
    p.add_argument("--side", choices=("spout", "bolt", "both"), default="spout")
    p.add_argument("--rate", type=float, default=1000.0, help="records emitted per second")
    p.add_argument("--message-timeout", type=float, default=10.0)
    p.add_argument("--shards", type=int, default=3, help="acker shards to start")
    args = p.parse_args(argv)
    workload = WorkloadConfig(
        rate=args.rate, hold=args.hold, max_pending=max(5000, int(2 * args.rate * (args.hold + 1)))
    )
    factors = [int(r) for r in args.replicas.split(",") if r]
    if args.mode == "kills":
        runs = []
        for replicas in factors:
            extra = ("--replicas", str(replicas))
            with ProcessCluster(count=args.shards, message_timeout=args.message_timeout, extra_args=extra) as cluster:
                runs.append(
                    run_kills(cluster, kills=args.kills, every=args.every, down=args.seconds, workload=workload)
                )
        print(json.dumps({"message_timeout": args.message_timeout, "rate": args.rate, "runs": runs}, sort_keys=True))
        return 0
    if factors != [1]:
        p.error("--replicas other than 1 is for --mode kills")
    with ProcessCluster(count=args.shards, message_timeout=args.message_timeout) as cluster:
        if args.mode == "restart":
            result = run_restart(cluster, seconds=args.seconds, gap=args.gap, workload=workload)
        else:
            result = run_cuts(
                cluster.addresses,
                cuts=args.cuts,
                seconds=args.seconds,
                gap=args.gap,
                side=args.side,
                workload=workload,
                fault="half_open" if args.mode == "half_open" else "cut",
            )
    result["message_timeout"] = args.message_timeout
    result["rate"] = args.rate
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
