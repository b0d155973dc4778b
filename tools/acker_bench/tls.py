"""acker-bench --mode apply --compare-tls: the same Apply load into plaintext and TLS ackers, in one run.

Two embedded clusters of the same size are started, one plaintext and one
serving TLS with a throwaway CA (``acker_bench.testcerts``, which needs the
``cryptography`` package), and the apply benchmark alternates between them
for ``rounds`` rounds so that drift in the machine's load hits both alike.
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from acker_protocol.credentials import ChannelSecurity

from .apply import ApplyBenchConfig, run_apply_bench

__all__ = ["compare_tls"]


def compare_tls(
    ackers: int, batch_ops: int, duration: float, processes: int, message_timeout: float, rounds: int = 2
) -> dict:
    """Apply ops/s without and with TLS (each round: plaintext, then TLS) and the median overhead."""
    from acker_service.process_cluster import ProcessCluster

    from .testcerts import CertificateAuthority

    with tempfile.TemporaryDirectory(prefix="acker-bench-tls-") as folder:
        ca = CertificateAuthority(Path(folder), "bench-ca")
        server = ca.issue("localhost", server=True)
        security = ChannelSecurity(tls_ca=ca.ca)
        tls_args = ("--tls-cert", server.cert, "--tls-key", server.key)
        plain = ProcessCluster(count=ackers, message_timeout=message_timeout)
        secure = ProcessCluster(count=ackers, message_timeout=message_timeout, extra_args=tls_args, security=security)
        with plain, secure:
            runs: dict[str, list[float]] = {"plaintext": [], "tls": []}
            for _ in range(rounds):
                for name, cluster, sec in (("plaintext", plain, None), ("tls", secure, security)):
                    result = run_apply_bench(ApplyBenchConfig(
                        addresses=tuple(cluster.addresses), batch_ops=batch_ops, duration=duration,
                        processes=processes, security=sec,
                    ))  # fmt: skip
                    runs[name].append(result["apply_ops_per_s"])
    plain_ops, tls_ops = statistics.median(runs["plaintext"]), statistics.median(runs["tls"])
    return {
        "mode": "apply-compare-tls",
        "ackers": ackers,
        "processes": processes,
        "batch_ops": batch_ops,
        "rounds": rounds,
        "plaintext_ops_per_s": runs["plaintext"],
        "tls_ops_per_s": runs["tls"],
        "tls_overhead_percent": round(100 * (plain_ops - tls_ops) / plain_ops, 1),
    }
