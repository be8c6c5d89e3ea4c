"""`tokenyard bench serve --plots DIR`: the run as PNG figures (matplotlib, the `sim` extra).

    ttft_tpot_cdf.png     CDFs of TTFT and TPOT over the successful requests, p50 / p99 marked
    latency_by_class.png  CDFs of TTFT and end-to-end latency, one line per priority class
    worker_load.png       per worker over the run: running requests (BS) and KV-cache use, from
                          the workers' heartbeats (`llm.v1.hb.*`), read while the run lasts

The load per worker comes from the fleet, not from the client: an HTTP client never learns
which worker served it, and a heartbeat also shows the work other clients put there. The
heartbeats are read from the target when it is `nats://`, else from `--fleet-nats URL`;
without either, worker_load.png is not drawn and the run says why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from time import perf_counter

from tokenyard.loadgen.records import RequestRecord
from tokenyard.shared import codec, natsutil, schemas, subjects


@dataclass(slots=True)
class LoadSample:
    t: float
    """perf_counter() when the heartbeat arrived: the records' clock."""
    worker_id: str
    running: int
    waiting: int
    kv_usage: float


@dataclass
class HeartbeatSampler:
    """Every worker heartbeat that arrives while the run lasts."""

    nats_url: str
    samples: list[LoadSample] = field(default_factory=list)

    async def start(self) -> HeartbeatSampler:
        self.nc = await natsutil.connect(self.nats_url, "tokenyard-bench-plots")
        await self.nc.subscribe(subjects.HEARTBEAT_ALL, cb=self._on_heartbeat)
        return self

    async def _on_heartbeat(self, msg) -> None:
        try:
            hb = codec.decode(msg.data, schemas.Heartbeat)
        except codec.DecodeError:
            return
        s = hb.stats
        total = s.kv_blocks_used + s.kv_blocks_free
        self.samples.append(LoadSample(perf_counter(), hb.worker_id, s.running, s.waiting,
                                       s.kv_blocks_used / total if total else 0.0))

    async def stop(self) -> list[LoadSample]:
        await self.nc.drain()
        return self.samples


def _cdf(ax, values_ms: list[float], label: str) -> None:
    import numpy as np

    if not values_ms:
        return
    xs = np.sort(np.asarray(values_ms))
    ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=label)


def write_plots(records: list[RequestRecord], samples: list[LoadSample] | None, out_dir: str) -> dict[str, str]:
    """Draw the figures into `out_dir`; returns {figure: path} (no worker_load without samples)."""
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("--plots needs matplotlib: install the `sim` extra") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    os.makedirs(out_dir, exist_ok=True)
    ok = [r for r in records if r.success]
    written: dict[str, str] = {}

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ttft = [r.ttft * 1000 for r in ok]
    tpot = [r.tpot * 1000 for r in ok if r.tpot is not None]
    for ax, values, name in ((a, ttft, "TTFT"), (b, tpot, "TPOT")):
        _cdf(ax, values, name)
        if values:
            for q, style in ((50, "--"), (99, ":")):
                v = float(np.percentile(values, q))
                ax.axvline(v, color="grey", linestyle=style, label=f"p{q} {v:.1f} ms")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name} CDF ({len(values)} requests)")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.tight_layout()
    written["ttft_tpot_cdf"] = os.path.join(out_dir, "ttft_tpot_cdf.png")
    fig.savefig(written["ttft_tpot_cdf"], dpi=110)
    plt.close(fig)

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for c in sorted({r.priority for r in ok}):
        mine = [r for r in ok if r.priority == c]
        _cdf(a, [r.ttft * 1000 for r in mine], f"P{c} ({len(mine)})")
        _cdf(b, [r.e2el * 1000 for r in mine], f"P{c} ({len(mine)})")
    for ax, name in ((a, "TTFT"), (b, "end-to-end latency")):
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of the class's requests")
        ax.set_title(f"{name} by priority class")
        ax.grid(alpha=0.3)
        if ok:
            ax.legend(loc="lower right")
    fig.tight_layout()
    written["latency_by_class"] = os.path.join(out_dir, "latency_by_class.png")
    fig.savefig(written["latency_by_class"], dpi=110)
    plt.close(fig)

    if samples:
        t0 = min((r.send_s for r in records), default=samples[0].t)
        fig, (a, b) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
        for wid in sorted({s.worker_id for s in samples}):
            mine = [s for s in samples if s.worker_id == wid]
            ts = [s.t - t0 for s in mine]
            a.step(ts, [s.running for s in mine], where="post", label=wid)
            b.step(ts, [100 * s.kv_usage for s in mine], where="post", label=wid)
        a.set_ylabel("running requests (BS)")
        a.set_title("load per worker (heartbeats)")
        b.set_ylabel("KV cache used (%)")
        b.set_xlabel("seconds since the first request")
        for ax in (a, b):
            ax.grid(alpha=0.3)
            ax.legend(loc="upper right", fontsize="small", ncol=4)
        fig.tight_layout()
        written["worker_load"] = os.path.join(out_dir, "worker_load.png")
        fig.savefig(written["worker_load"], dpi=110)
        plt.close(fig)
    return written
