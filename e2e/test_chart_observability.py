"""The chart's observability pieces: metrics Services, ServiceMonitors, alerts, dashboard.

Rendered with every option on, then checked four ways:

* structure: each ServiceMonitor selects a metrics Service, the extender serves
  its metrics on a port of their own while its HTTP port stays on loopback;
* the API server: the local cluster has no Prometheus Operator, so the test
  installs `e2e/fixtures/monitoring-crds.yaml`, a hand-written subset of the
  upstream ServiceMonitor and PrometheusRule schemas (field names, types,
  duration patterns), and the server-side dry-run validates against that;
* the rules: Debian's `promtool check rules`, and every metric a rule reads is
  one the operator or the extender exports (their registries, imported here);
* a real Prometheus scrapes the running operator and an extender started with
  `--metrics-port`, loads the rules and evaluates them without error; the
  extender's "down" alert goes pending once it stops, and every dashboard
  query runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chronotope.devcluster.process import free_port
from e2e.kubetest import KubeCluster, prometheus_server, wait_for
from tests.metric_names import PROMETHEUS_SERIES, component_registries, names_in, series_names

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "chronotope"
MONITORING_CRDS = Path(__file__).resolve().parent / "fixtures" / "monitoring-crds.yaml"
RELEASE, NAMESPACE = "t", "default"
ALL_ON = [
    "--set",
    "metrics.serviceMonitor=true",
    "--set",
    "metrics.prometheusRule=true",
    "--set",
    "metrics.grafanaDashboard=true",
    "--set",
    "metrics.labels.release=prometheus",
]


def _helm() -> str:
    from chronotope.devcluster.binaries import ensure_binaries
    from chronotope.devcluster.settings import ClusterSettings

    return str(ensure_binaries(ClusterSettings.from_env(), build=False).helm)


def _run(*argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture(scope="module")
def rendered() -> str:
    helm = _helm()
    lint = _run(helm, "lint", "--strict", str(CHART), *ALL_ON)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = _run(
        helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--kube-version", "1.33.0", *ALL_ON,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


def _docs(rendered: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(rendered) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def _rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rule = _one(docs, "PrometheusRule", f"{RELEASE}-alerts")
    return [r for g in rule["spec"]["groups"] for r in g["rules"]]


def test_metrics_services_and_their_service_monitors(rendered: str) -> None:
    docs = _docs(rendered)
    sched = _one(docs, "Deployment", f"{RELEASE}-scheduler")
    extender = next(
        c for c in sched["spec"]["template"]["spec"]["containers"] if c["name"] == "extender"
    )
    assert "--host=127.0.0.1" in extender["args"]  # kube-scheduler's calls stay on loopback
    assert "--metrics-port=9102" in extender["args"]
    assert "--metrics-address=0.0.0.0" in extender["args"]
    assert {"name": "metrics", "containerPort": 9102} in extender["ports"]
    services = [d for d in docs if d["kind"] == "Service"]
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {
        f"{RELEASE}-operator",
        f"{RELEASE}-extender",
    }
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "prometheus"  # metrics.labels
        selector = monitor["spec"]["selector"]["matchLabels"]
        port = monitor["spec"]["endpoints"][0]["port"]
        matched = [
            s for s in services
            if selector.items() <= s["metadata"]["labels"].items()
            and any(p["name"] == port for p in s["spec"]["ports"])
        ]  # fmt: skip
        assert len(matched) == 1, monitor["metadata"]["name"]
        # the Service reaches a container port of that name in the pods it selects
        pods = [
            d for d in docs
            if d["kind"] in ("Deployment", "DaemonSet")
            and matched[0]["spec"]["selector"].items()
            <= d["spec"]["template"]["metadata"]["labels"].items()
        ]  # fmt: skip
        target = matched[0]["spec"]["ports"][0]["targetPort"]
        assert any(
            p.get("name") == target
            for d in pods
            for c in d["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        )


def test_dashboard_config_map_carries_the_dashboard(rendered: str) -> None:
    cm = _one(_docs(rendered), "ConfigMap", f"{RELEASE}-grafana-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "chronotope.json").read_text())
    assert json.loads(cm["data"]["chronotope.json"]) == shipped


def test_rules_pass_promtool_and_read_only_exported_metrics(rendered: str, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool (Debian `prometheus` package) is needed: hack/system-packages.sh")
    docs = _docs(rendered)
    rule = _one(docs, "PrometheusRule", f"{RELEASE}-alerts")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    checked = _run(promtool, "check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    exported = series_names(component_registries())
    rules = _rules(docs)
    assert len(rules) >= 10
    for r in rules:
        used = names_in(r["expr"])
        assert used, f"{r['alert']} reads no metric"
        unknown = used - exported.keys() - PROMETHEUS_SERIES
        assert not unknown, f"{r['alert']} reads {sorted(unknown)}: no component exports it"
        assert r["labels"]["severity"] in ("critical", "warning", "info")
        assert r["annotations"]["summary"]
        assert r["annotations"]["description"]


@pytest.fixture
def monitoring_crds(kube_cluster: KubeCluster) -> Iterator[None]:
    kube_cluster.run_kubectl("apply", "-f", str(MONITORING_CRDS))
    for name in ("prometheusrules", "servicemonitors"):
        kube_cluster.run_kubectl(
            "wait",
            "--for=condition=Established",
            f"crd/{name}.monitoring.coreos.com",
            "--timeout=60s",
        )
    try:
        yield
    finally:
        kube_cluster.run_kubectl("delete", "-f", str(MONITORING_CRDS), "--wait=false", check=False)


def test_the_api_server_accepts_the_render_with_every_option(
    kube_cluster: KubeCluster, monitoring_crds: None, rendered: str
) -> None:
    applied = _run(*kube_cluster.kubectl, "apply", "--dry-run=server", "-f", "-", stdin=rendered)
    assert applied.returncode == 0, applied.stderr
    assert (
        "servicemonitor.monitoring.coreos.com/t-extender created (server dry run)" in applied.stdout
    )
    assert (
        "prometheusrule.monitoring.coreos.com/t-alerts created (server dry run)" in applied.stdout
    )
    # the schema is real enough to refuse a misspelt field and a bad duration
    rule = _one(_docs(rendered), "PrometheusRule", f"{RELEASE}-alerts")
    bad_field = json.loads(json.dumps(rule))
    bad_field["spec"]["groups"][0]["rules"][0]["fo"] = "5m"
    bad_for = json.loads(json.dumps(rule))
    bad_for["spec"]["groups"][0]["rules"][0]["for"] = "5 minutes"
    for bad in (bad_field, bad_for):
        refused = _run(
            *kube_cluster.kubectl, "apply", "--dry-run=server", "-f", "-", stdin=json.dumps(bad)
        )
        assert refused.returncode != 0


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _alert_states(url: str) -> dict[str, tuple[str, str]]:
    """alert -> (health, state) for every rule Prometheus has evaluated at least once."""
    groups = _get(f"{url}/api/v1/rules")["data"]["groups"]
    return {
        r["name"]: (r["health"], r["state"])
        for g in groups
        for r in g["rules"]
        if not r["lastEvaluation"].startswith("0001-")
    }


def _targets_up(url: str) -> set[str]:
    active = _get(f"{url}/api/v1/targets")["data"]["activeTargets"]
    return {t["labels"]["job"] for t in active if t["health"] == "up"}


@pytest.fixture
def prometheus(
    kube_cluster: KubeCluster, chronotope_operator: int, rendered: str, tmp_path: Path
) -> Iterator[tuple[str, Any]]:
    """A real Prometheus with the chart's rules, scraping the operator and an extender.

    Yields its URL and the function that stops the extender.
    """
    local = kube_cluster.local
    state = local.load_state()
    assert state is not None
    assert state.operator_metrics_port
    port, metrics_port = free_port(), free_port()
    local.start_component(
        "observability-extender",
        [
            sys.executable, "-m", "chronotope", "scheduler",
            "--kubeconfig", str(kube_cluster.kubeconfig),
            "--port", str(port),
            *local.extender_pki().server_args(),
            "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1",
        ],
        f"https://127.0.0.1:{port}/healthz",
    )  # fmt: skip
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
        assert "chronotope_extender_request_seconds" in resp.read().decode()
    rule = _one(_docs(rendered), "PrometheusRule", f"{RELEASE}-alerts")
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    # jobs named and labelled as the ServiceMonitors would: job = Service name, its namespace
    scrape = [
        (f"{RELEASE}-operator-metrics", state.operator_metrics_port),
        (f"{RELEASE}-extender-metrics", metrics_port),
    ]
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yaml")],
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{p}"], "labels": {"namespace": NAMESPACE}}
                ],
            }
            for job, p in scrape
        ],
    }
    try:
        with prometheus_server(config, tmp_path) as url:
            yield url, lambda: local.stop_component("observability-extender")
    finally:
        local.stop_component("observability-extender")


def test_prometheus_evaluates_the_rules_on_live_metrics(
    prometheus: tuple[str, Any], rendered: str
) -> None:
    url, stop_extender = prometheus
    jobs = {f"{RELEASE}-operator-metrics", f"{RELEASE}-extender-metrics"}

    def healthy_and_quiet() -> dict[str, tuple[str, str]] | None:
        try:
            if _targets_up(url) != jobs:
                return None
            states = _alert_states(url)
        except OSError:
            return None
        everyone = {r["alert"] for r in _rules(_docs(rendered))}
        if set(states) != everyone:
            return None  # not every rule evaluated yet
        down = ("ChronotopeOperatorDown", "ChronotopeExtenderDown", "ChronotopeOperatorNoLeader")
        if any(states[a][1] != "inactive" for a in down):
            return None  # still evaluated on the empty TSDB of the first seconds
        return states

    states = wait_for(healthy_and_quiet, 90, "both targets up and every rule evaluated, quiet")
    assert all(health == "ok" for health, _ in states.values()), states

    # every dashboard query runs on the live data; the leader panel shows the operator leading
    dashboard = json.loads((CHART / "dashboards" / "chronotope.json").read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "1m")
            q = urllib.parse.urlencode({"query": expr})
            answer = _get(f"{url}/api/v1/query?{q}")
            assert answer["status"] == "success", (panel["title"], answer)
            if "chronotope_operator_leader" in expr:
                assert [float(r["value"][1]) for r in answer["data"]["result"]] == [1.0]

    # a rule really reads its target: the extender stops, its alert goes pending (for: 5m)
    stop_extender()
    wait_for(
        lambda: _alert_states(url).get("ChronotopeExtenderDown", ("", ""))[1] == "pending",
        60,
        "ChronotopeExtenderDown pending",
    )
    assert all(health == "ok" for health, _ in _alert_states(url).values())
