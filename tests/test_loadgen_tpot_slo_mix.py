"""`bench serve --tpot-slo-mix`: each request sends a seeded `tpot_slo_ms`, goodput judges it
by its own TPOT SLO, and the result reports each SLO's requests. The draw is checked for
determinism and independence from the other draws; the metrics on hand-built records; the
wire on a real nats-server (a fake admission records what arrived) and through the edge's
own request parser (what an HTTP body becomes)."""

from __future__ import annotations

import argparse
import io
import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from tokenyard.loadgen import cli
from tokenyard.loadgen.config import BenchConfig, parse_tpot_slo_mix
from tokenyard.loadgen.metrics import compute_metrics, is_good
from tokenyard.loadgen.records import RequestRecord
from tokenyard.loadgen.report import print_result
from tokenyard.loadgen.serve import run_bench
from tokenyard.loadgen.targets import HttpTarget
from tokenyard.loadgen.workload import make_workload
from tokenyard.shared import codec, natsutil, schemas, subjects
from tokenyard.shared.openai_api import Endpoint, parse_request

MIX = ((50.0, 0.5), (200.0, 0.5))


def cfg(**kw) -> BenchConfig:
    args = dict(num_prompts=400, input_len=64, output_len=16, range_ratio=0.25, seed=3, tpot_slo_mix=MIX)
    return BenchConfig(**{**args, **kw})


def test_parse_and_validate():
    assert parse_tpot_slo_mix("50:0.5,200:0.5") == MIX
    assert parse_tpot_slo_mix("100:1") == ((100.0, 1.0),)
    assert parse_tpot_slo_mix(None) == () and parse_tpot_slo_mix("") == ()
    for bad in ("50", "50:x", "x:1", "0:1", "-5:1", "50:-1", "50:0,200:0", "50:1,50:1", "inf:1", "50:inf"):
        with pytest.raises(ValueError, match="tpot-slo-mix"):
            parse_tpot_slo_mix(bad)
    with pytest.raises(ValueError, match="tpot-slo-mix"):
        BenchConfig(tpot_slo_mix=((50.0, -1.0),)).validate()
    assert BenchConfig(tpot_slo_mix=MIX).describe()["tpot_slo_mix"] == [[50.0, 0.5], [200.0, 0.5]]


def test_the_draw_is_seeded_and_leaves_every_other_draw_alone():
    with_mix = list(make_workload(cfg()).requests())
    again = list(make_workload(cfg()).requests())
    without = list(make_workload(cfg(tpot_slo_mix=())).requests())
    other_seed = list(make_workload(cfg(seed=4)).requests())
    assert [r.tpot_slo_ms for r in with_mix] == [r.tpot_slo_ms for r in again]
    assert [r.tpot_slo_ms for r in with_mix] != [r.tpot_slo_ms for r in other_seed]
    assert all(r.tpot_slo_ms is None for r in without)
    # the same prompts, lengths, classes and arrivals with or without the mix
    strip = [(r.prompt, r.max_tokens, r.priority, r.arrival_s) for r in with_mix]
    assert strip == [(r.prompt, r.max_tokens, r.priority, r.arrival_s) for r in without]
    counts = Counter(r.tpot_slo_ms for r in with_mix)
    assert set(counts) == {50.0, 200.0}
    assert 160 <= counts[50.0] <= 240  # 400 fair coin flips: 200 ± 4σ


def test_a_short_run_is_a_prefix_and_block_workloads_get_slos_too():
    long = [r.tpot_slo_ms for r in make_workload(cfg()).requests()]
    short = [r.tpot_slo_ms for r in make_workload(cfg(num_prompts=50)).requests()]
    assert short == long[:50]
    chat = list(make_workload(cfg(workload="chatbot", num_prompts=60)).requests())
    assert len(chat) == 60 and {r.tpot_slo_ms for r in chat} == {50.0, 200.0}


@settings(max_examples=30, deadline=None)
@given(shares=st.lists(st.integers(0, 5), min_size=1, max_size=4).filter(lambda s: sum(s) > 0),
       seed=st.integers(0, 2**32 - 1))
def test_only_slos_with_a_share_are_drawn(shares, seed):
    mix = tuple((10.0 * (i + 1), float(f)) for i, f in enumerate(shares))
    drawn = {r.tpot_slo_ms for r in make_workload(cfg(tpot_slo_mix=mix, num_prompts=60, seed=seed)).requests()}
    assert drawn <= {ms for ms, f in mix if f > 0}


def rec(index: int, slo: float | None, send: float, chunks: list[float]) -> RequestRecord:
    r = RequestRecord(index=index, priority=1, prompt_len=10, tpot_slo_ms=slo, send_s=send, chunk_s=chunks)
    r.usage_completion_tokens = len(chunks)
    r.close(send + 10)
    return r


def records() -> list[RequestRecord]:
    return [
        rec(0, 50.0, 0.0, [0.1, 0.14, 0.18]),  # ttft 100, tpot 40: meets 50
        rec(1, 50.0, 1.0, [1.1, 1.16, 1.22]),  # tpot 60: misses 50
        rec(2, 200.0, 2.0, [2.1, 2.25, 2.4]),  # tpot 150: meets 200
        rec(3, 200.0, 3.0, [3.9, 4.0]),  # ttft 900, tpot 100
    ]


def test_goodput_judges_each_request_by_its_own_tpot_slo():
    r = records()
    assert [is_good(x, {"tpot": 30.0}) for x in r] == [True, False, True, True]  # its own SLO wins
    m = compute_metrics(r, 4.0)  # no --goodput: the requests' own TPOT SLOs alone
    assert m["request_goodput"] == pytest.approx(3 / 4)
    assert m["by_tpot_slo"]["50"]["completed"] == 2 and m["by_tpot_slo"]["50"]["request_goodput"] == pytest.approx(1 / 4)
    assert m["by_tpot_slo"]["200"]["request_goodput"] == pytest.approx(2 / 4)
    assert m["by_tpot_slo"]["200"]["median_tpot_ms"] == pytest.approx(125.0)
    with_ttft = compute_metrics(r, 4.0, {"ttft": 500.0})  # and the TTFT SLO: request 3 is late
    assert with_ttft["request_goodput"] == pytest.approx(2 / 4)
    assert with_ttft["by_tpot_slo"]["200"]["request_goodput"] == pytest.approx(1 / 4)
    out = io.StringIO()
    print_result(with_ttft, Console(file=out, width=200))
    assert "By TPOT SLO sent" in out.getvalue()


def test_requests_without_an_slo_are_their_own_group_and_no_mix_means_no_groups():
    r = [*records(), rec(4, None, 5.0, [5.1, 5.2])]
    m = compute_metrics(r, 4.0, {"tpot": 50.0})
    assert set(m["by_tpot_slo"]) == {"50", "200", "none"}
    assert m["by_tpot_slo"]["none"]["request_goodput"] == 0.0  # tpot 100 > the global 50
    plain = [rec(0, None, 0.0, [0.1, 0.2])]
    assert "by_tpot_slo" not in compute_metrics(plain, 1.0) and compute_metrics(plain, 1.0)["request_goodput"] is None


def test_an_http_body_carries_the_slo_to_the_edge_parser():
    req = next(iter(make_workload(cfg()).requests()))
    parsed = parse_request(json.dumps(_body(req)).encode(), Endpoint.COMPLETIONS, [], "rid")
    assert req.tpot_slo_ms in (50.0, 200.0) and parsed.tpot_slo_ms == req.tpot_slo_ms


def _body(req) -> dict:
    target = HttpTarget.__new__(HttpTarget)  # no session: body() reads model and tenant only
    target.model, target.tenant = "m", None
    return target.body(req)


@pytest.fixture(scope="module")
async def nats_url(plain_nats):
    return plain_nats.url


async def test_each_request_arrives_with_its_slo_and_the_result_reports_each_group(nats_url, tmp_path):
    """A fake admission on a real nats-server records each request's tpot_slo_ms and serves it."""
    seen: dict[str, float | None] = {}
    nc = await natsutil.connect(nats_url, "fake-admission-slo")

    async def handle(msg) -> None:
        req = codec.decode(msg.data, schemas.GenerateRequest, json=codec.is_json(msg.headers))
        seen[req.request_id.rsplit("-", 1)[1]] = req.tpot_slo_ms
        n, plen = req.max_tokens, len(req.prompt)
        events = [schemas.Accepted(req.request_id, 1, plen),
                  *(schemas.Chunk(req.request_id, s, "x", [120]) for s in range(n)),
                  schemas.Finished(req.request_id, n, "length", schemas.Usage(plen, n, plen + n))]
        for e in events:
            await nc.publish(msg.reply, codec.encode(e))

    sub = await nc.subscribe(subjects.SUBMIT, cb=handle)
    await nc.flush()  # the SUB is at the server before the bench's first publish (another connection)
    c = cfg(target=nats_url, model="m", num_prompts=30, progress=False, request_timeout_s=10.0,
            goodput={"ttft": 10_000.0})
    try:
        result = await run_bench(c)
    finally:
        await sub.unsubscribe()
        await nc.drain()
    sent = {str(r.index): r.tpot_slo_ms for r in make_workload(c).requests()}
    assert seen == sent
    groups = Counter(f"{ms:g}" for ms in sent.values())
    assert {k: b["completed"] for k, b in result["by_tpot_slo"].items()} == dict(groups)
    assert result["completed"] == 30 and result["tpot_slo_mix"] == [[50.0, 0.5], [200.0, 0.5]]


def test_cli_option(tmp_path):
    p = argparse.ArgumentParser(prog="tokenyard")
    cli.register(p.add_subparsers(dest="command", required=True))
    args = p.parse_args(["bench", "serve", "--target", "http://h:1", "--tpot-slo-mix", "50:0.5,200:0.5"])
    assert cli.config_from_args(args).tpot_slo_mix == MIX
    bad = p.parse_args(["bench", "serve", "--no-progress", "--tpot-slo-mix", "50"])
    assert cli.serve_main(bad) == 2

