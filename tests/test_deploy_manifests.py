"""deploy/ checked offline: the Helm chart, compose, the Grafana dashboard, the Dockerfiles.

`helm` is not installable from the registries here, so the chart's templates are kept to value
lookups only — `{{ .Values.a.b }}`, `{{ .Release.Name }}`, `{{ .Release.Namespace }}`,
`{{ .Files.Get "f" | indent N }}` — and rendered by `render` below (any other template
construct fails the test: it would need the real helm). Every rendered object is then
validated against the Kubernetes OpenAPI schemas by kubernetes-validate (strict: an unknown
field fails), and each container's arguments are parsed by tokenyard's own CLI parser.
compose: `docker-compose config` where it is installed (Debian's docker-compose; no Docker
engine needed), plus the same argument check; Prometheus configs through `promtool`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from tokenyard.shared import metrics, schemas

from tokenyard.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "k8s" / "tokenyard"
COMPOSE = ROOT / "deploy" / "compose"
K8S_VERSION = "1.30"
TEMPLATE = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}")


def lookup(tree: dict, dotted: str):
    node = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise KeyError(f"no value {dotted}")
        node = node[key]
    return node


def render(text: str, values: dict, release: str = "ty", namespace: str = "serving") -> str:
    def one(match: re.Match) -> str:
        expr = match.group(1)
        if expr.startswith(".Values."):
            return str(lookup(values, expr.removeprefix(".Values.")))
        if expr == ".Release.Name":
            return release
        if expr == ".Release.Namespace":
            return namespace
        m = re.fullmatch(r'\.Files\.Get "([^"]+)" \| indent (\d+)', expr)
        if m:
            body = (CHART / m.group(1)).read_text().rstrip("\n")
            return "\n".join(" " * int(m.group(2)) + line for line in body.splitlines())
        raise AssertionError(f"template construct this test cannot render (needs helm): {{{{ {expr} }}}}")

    return TEMPLATE.sub(one, text)


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    out = []
    for path in sorted((CHART / "templates").glob("*.yaml")):
        for doc in yaml.safe_load_all(render(path.read_text(), values)):
            if doc:
                doc["_file"] = path.name
                out.append(doc)
    return out


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_every_object_validates_against_the_kubernetes_schemas(objects):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    assert len(objects) >= 12
    for obj in objects:
        doc = {k: v for k, v in obj.items() if k != "_file"}
        try:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{obj['_file']}: {obj['kind']}/{obj['metadata']['name']}: {e.message}") from None


def test_a_deployment_per_service_workers_a_gpu_statefulset(objects):
    deployments = by_kind(objects, "Deployment")
    assert set(deployments) == {f"ty-{s}" for s in ("edge", "admission", "queue", "router", "macro")}
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for name, dep in deployments.items():
        assert dep["spec"]["replicas"] == values[name.removeprefix("ty-")]["replicas"]
        assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    workers = by_kind(objects, "StatefulSet")["ty-worker"]
    container = workers["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert container["image"] == values["image"]["worker"]


def test_hpas_scale_existing_workloads_on_metrics_the_adapter_serves(objects):
    adapter = yaml.safe_load((ROOT / "deploy" / "k8s" / "prometheus-adapter-values.yaml").read_text())["rules"]
    served = {r["name"]["as"]: r["seriesQuery"].split("{")[0] for kind in ("custom", "external") for r in adapter[kind]}
    workloads = {(o["kind"], o["metadata"]["name"]) for o in objects}
    hpas = by_kind(objects, "HorizontalPodAutoscaler")
    assert set(hpas) == {"ty-edge", "ty-admission", "ty-router", "ty-worker"}
    ours = family_names()
    for hpa in hpas.values():
        ref = hpa["spec"]["scaleTargetRef"]
        assert (ref["kind"], ref["name"]) in workloads
        for m in hpa["spec"]["metrics"]:
            name = m[m["type"].lower()]["metric"]["name"]
            assert name in served, name
            assert served[name] in ours, served[name]  # the adapter reads a series tokenyard exports
    assert hpas["ty-worker"]["spec"]["metrics"][0]["external"]["metric"]["name"] == "tokenyard_queue_depth"


def container_args(argv: list[str], env: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), "x"), a) for a in argv]


def test_every_container_command_is_one_tokenyard_accepts(objects):
    parser = build_parser()
    for obj in objects:
        if obj["kind"] not in ("Deployment", "StatefulSet"):
            continue
        for c in obj["spec"]["template"]["spec"]["containers"]:
            args = parser.parse_args(container_args(c["args"], {"POD_NAME": "ty-worker-0"}))
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert env["TOKENYARD_NATS_URL"].count("nats://") == 3  # every NATS node
            assert env["TOKENYARD_METRICS_PORT"] == "9400"
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            annotations = obj["spec"]["template"]["metadata"]["annotations"]
            assert annotations["prometheus.io/port"] == str(ports["metrics"])
            assert args.command in ("edge", "admission", "queue", "router", "macro", "worker")


def test_chart_depends_on_the_official_nats_chart_clustered_with_jetstream_files():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (dep,) = chart["dependencies"]
    assert dep["name"] == "nats" and dep["repository"] == "https://nats-io.github.io/k8s/helm/charts/"
    values = yaml.safe_load((CHART / "values.yaml").read_text())["nats"]
    assert values["config"]["cluster"] == {"enabled": True, "replicas": 3}
    assert values["config"]["jetstream"]["fileStore"]["enabled"] is True
    # The service URLs name the pods of that chart's StatefulSet.
    url = yaml.safe_load((CHART / "values.yaml").read_text())["natsUrl"]
    assert [u.split("//")[1].split(".")[0] for u in url.split(",")] == [
        f"{values['fullnameOverride']}-{i}" for i in range(3)]


def family_names() -> set[str]:
    """Every metric family tokenyard exports (sample names included)."""
    admission, router, macro = metrics.AdmissionMetrics(), metrics.RouterMetrics("p"), metrics.MacroMetrics()
    admission.observe("rejected_rate", "rate_limit_exceeded")  # a labelled family shows once it has a child
    router.observe("routed", 0.001, 1, 2)
    macro.observe_states([schemas.MacroState("m0", "nodg", ["w"], {"w": "mixed"}, ["w"], 0, 0.0)])
    registries = [admission.registry, router.registry, macro.registry]
    w = metrics.WorkerMetrics("w", "m")
    w.heartbeat = schemas.Heartbeat("w", "m", 1, 0.0, schemas.EngineStats(0, 0, 0, 0, 1, 16))
    w.observe_finished(0.1, 0.2, 1, 2, "length")
    q = metrics.QueueMetrics(lambda: schemas.QueueStats("q", 0.0, "fcfs", [0] * 4, [0] * 4))
    q.observe_dispatch("routed", 0, 0.1)
    from tokenyard.services.edge.shell import EdgeMetrics

    text = b"".join(generate_latest(r) for r in [*registries, w.registry, q.registry, EdgeMetrics().registry])
    return {line.split("{")[0].split(" ")[0] for line in text.decode().splitlines() if line and line[0] != "#"}


def test_grafana_dashboard_queries_only_metrics_tokenyard_exports():
    dash = json.loads((ROOT / "deploy" / "grafana" / "tokenyard.json").read_text())
    assert (CHART / "dashboards" / "tokenyard.json").read_text() == (ROOT / "deploy/grafana/tokenyard.json").read_text()
    ours = family_names()
    used = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\b(?:vllm|tokenyard):[a-z_:]+", target["expr"]))
    assert used and used <= ours, used - ours
    for topic in ("queue_depth", "refusals_total", "router_decisions_total", "router_pxbs_spread",
                  "prefix_cache_hits_total", "num_preemptions_total", "macro_migrations_total", "macro_workers"):
        assert any(topic in u for u in used), topic


def compose() -> dict:
    return yaml.safe_load((COMPOSE / "compose.yaml").read_text())


def test_compose_three_nats_nodes_replicas_prometheus_and_trace_ui():
    services = compose()["services"]
    nats = [s for s in services if s.startswith("nats")]
    assert len(nats) == 3
    for name in nats:
        cmd = services[name]["command"]
        routes = cmd[cmd.index("--routes") + 1].split(",")
        assert sorted(r.split("//")[1].split(":")[0] for r in routes) == sorted(nats)
        assert "-js" in cmd
    assert services["admission"]["deploy"]["replicas"] == 2 and services["worker"]["deploy"]["replicas"] == 4
    assert {"prometheus", "phoenix", "grafana"} <= set(services)
    parser = build_parser()
    for name, svc in services.items():
        if svc.get("image", "").startswith("tokenyard"):
            assert parser.parse_args(svc["command"]).command == name


@pytest.mark.skipif(shutil.which("docker-compose") is None and shutil.which("docker") is None,
                    reason="neither docker-compose nor docker is installed here")
def test_docker_compose_accepts_the_file():
    for cmd in (["docker-compose"], ["docker", "compose"]):
        if shutil.which(cmd[0]) is None:
            continue
        proc = subprocess.run([*cmd, "-f", str(COMPOSE / "compose.yaml"), "config", "-q"], capture_output=True,
                              text=True)
        if cmd == ["docker", "compose"] and "unknown" in proc.stderr:
            continue  # a docker CLI without the compose plugin
        assert proc.returncode == 0, proc.stderr
        return
    pytest.skip("no docker compose implementation here")


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) not installed")
def test_prometheus_configs_are_valid(tmp_path):
    generated = tmp_path / "fleet.yml"
    generated.write_text(metrics.prometheus_config({"router": "http://127.0.0.1:9401/metrics",
                                                    "worker-0": "http://127.0.0.1:9402/metrics"}, 0.5))
    for path in (COMPOSE / "prometheus.yml", generated):
        proc = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfiles_copy_what_exists_and_run_tokenyard():
    for name in ("Dockerfile", "worker-vllm.Dockerfile"):
        lines = [ln.strip() for ln in (ROOT / "deploy" / "docker" / name).read_text().splitlines()]
        instructions = [ln for ln in lines if ln and not ln.startswith("#")]
        assert any(ln.startswith("FROM ") for ln in instructions)
        for ln in instructions:
            if ln.startswith("COPY "):
                for src in ln.split()[1:-1]:
                    assert (ROOT / src).exists(), f"{name}: COPY {src}: not in the repository"
        assert 'ENTRYPOINT ["tokenyard"]' in instructions
    vllm = (ROOT / "deploy" / "docker" / "worker-vllm.Dockerfile").read_text()
    version = re.search(r"VLLM_VERSION=([\d.]+)", vllm).group(1)
    assert f'"vllm=={version}"' in (ROOT / "pyproject.toml").read_text()  # the image's vLLM is the extra's
