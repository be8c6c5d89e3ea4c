"""`tokenyard bench serve --plots DIR`: the figures from hand-made records and heartbeats, and
from a run against a live fleet whose workers' heartbeats are read while it lasts."""

from __future__ import annotations

import subprocess
import sys

import matplotlib.image as mpimg
from tokenyard.loadgen.config import BenchConfig
from tokenyard.loadgen.plots import LoadSample, write_plots
from tokenyard.loadgen.records import RequestRecord
from tokenyard.loadgen.serve import run_bench

PNG = b"\x89PNG\r\n\x1a\n"


def record(i: int, priority: int, ttft: float, gap: float, tokens: int) -> RequestRecord:
    r = RequestRecord(index=i, priority=priority, prompt_len=10, send_s=100.0 + i)
    r.chunk_s = [r.send_s + ttft + k * gap for k in range(tokens)]
    r.usage_completion_tokens = tokens
    r.close(r.chunk_s[-1])
    return r


def test_figures_from_records_and_heartbeats(tmp_path):
    records = [record(i, i % 3, 0.05 * (i + 1), 0.01, 5) for i in range(12)]
    failed = RequestRecord(index=99, priority=0, prompt_len=1, send_s=100.0)
    failed.close(101.0)  # no chunk: not in any latency figure
    samples = [LoadSample(100.0 + t / 10, w, running=t % 4, waiting=0, kv_usage=t / 40)
               for t in range(40) for w in ("w0", "w1")]
    out = write_plots([*records, failed], samples, str(tmp_path / "plots"))
    assert set(out) == {"ttft_tpot_cdf", "latency_by_class", "worker_load"}
    for path in out.values():
        with open(path, "rb") as f:
            assert f.read(8) == PNG
        h, w = mpimg.imread(path).shape[:2]
        assert w > 1000 and h > 400


def test_no_heartbeats_no_worker_figure(tmp_path):
    out = write_plots([record(0, 1, 0.1, 0.02, 3)], None, str(tmp_path))
    assert set(out) == {"ttft_tpot_cdf", "latency_by_class"}


async def test_bench_against_a_live_fleet_writes_every_figure(fleet, tmp_path):
    cfg = BenchConfig(target=fleet.nats_url, num_prompts=20, input_len=32, output_len=6, rate=200.0,
                      progress=False, plots_dir=str(tmp_path / "run"))
    result = await run_bench(cfg)
    assert result["completed"] == 20 and result["failed"] == 0
    assert set(result["plots"]) == {"ttft_tpot_cdf", "latency_by_class", "worker_load"}
    assert "plots_note" not in result
    for path in result["plots"].values():
        with open(path, "rb") as f:
            assert f.read(8) == PNG


def test_cli_offers_the_plot_options():
    out = subprocess.run([sys.executable, "-m", "tokenyard.cli", "bench", "serve", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--plots DIR" in out and "--fleet-nats URL" in out
