"""A real local Kubernetes control plane, started as plain processes.

The components are etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok.

Why not kind: these machines (and many CI runners) have no Docker engine. The
binaries are the real ones, built from pinned Kubernetes Go modules, so tests
exercise a real API server, real admission and a real scheduler; only the
kubelets are simulated, by kwok.

Each cluster owns a state directory (`<state_root>/<name>/`): certificates, the
admin kubeconfig, etcd data, one log per component and `state.json` with ports
and PIDs. `state.json` is written after every component starts, so `down` can
always clean up what a crashed `up` left behind. Ports are chosen free, so two
clusters can run side by side.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import shutil
import ssl
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import yaml

from chronotope.devcluster import components, process
from chronotope.devcluster.binaries import Binaries, ensure_binaries
from chronotope.devcluster.identities import (
    DEFAULT_NAMESPACE,
    DEFAULT_RELEASE,
    ChartIdentities,
    setup_chart_identities,
)
from chronotope.devcluster.kubeconfig import write_kubeconfig
from chronotope.devcluster.pki import ExtenderPki, Pki, extender_pki, generate_pki
from chronotope.devcluster.settings import ClusterSettings
from chronotope.sim.clusterspec import ClusterSpec, node_manifests

__all__ = ["ClusterError", "ClusterRecord", "LocalCluster"]

log = logging.getLogger(__name__)


WEBHOOK_NAME = "chronotope-devcluster"
"""Name of the webhook configurations `register_webhooks` writes (cluster-scoped)."""


def _webhooks_in_effect(api: Any) -> bool:
    """Whether the API server calls the webhook: a probe is denied, and one is defaulted."""
    from chronotope.kube.admission import dry_run_create
    from chronotope.workloads.admission_wire import VALIDATING_WEBHOOK

    gpus = {"limits": {"nvidia.com/gpu": 1}}
    spec = {
        "replicas": 1,
        "gpu": {"count": 1},
        "gpuTypes": [{"name": "probe", "relativeSpeed": 1.0}],
        "estimate": {"referenceGpuType": "probe", "durationSeconds": 1},
        # the CRD's schema accepts this template; only the webhook refuses it (GPUs go in spec.gpu)
        "template": {"spec": {"containers": [{"name": "w", "image": "x", "resources": gpus}]}},
    }
    probe = {
        "apiVersion": "chronotope.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": spec,
    }
    denied = dry_run_create(api, probe)
    good = dict(probe, spec=dict(spec, template={}))
    defaulted = dry_run_create(api, good)
    return (
        isinstance(denied, str)
        and VALIDATING_WEBHOOK in denied
        and isinstance(defaulted, dict)
        and "restart" in defaulted["spec"]
    )


class ClusterError(RuntimeError):
    """The cluster could not be brought up or torn down; the message says why."""


@dataclass
class ClusterRecord:
    """What `state.json` keeps about a running cluster: directory, ports, processes."""

    name: str
    directory: str
    ports: dict[str, int]
    processes: list[dict[str, Any]] = field(default_factory=list)
    spec_name: str | None = None
    operator_metrics_port: int | None = None
    operator_webhook_port: int | None = None

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig in the cluster's state directory."""
        return Path(self.directory) / "kubeconfig"

    @property
    def server(self) -> str:
        """The kube-apiserver URL on loopback."""
        return f"https://127.0.0.1:{self.ports['apiserver']}"


def _get(url: str, context: ssl.SSLContext | None = None) -> bool:
    with urllib.request.urlopen(url, timeout=2, context=context) as resp:
        return bool(resp.status == HTTPStatus.OK)


def _insecure() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


class LocalCluster:
    """Bring a named local cluster up or down; see the module docstring."""

    def __init__(self, settings: ClusterSettings, name: str = "chronotope") -> None:
        """Name the cluster; its state lives in `<settings.state_root>/<name>/`."""
        self.settings = settings
        self.name = name
        self.directory = settings.state_root / name
        self.state_file = self.directory / "state.json"
        self._extender_args: tuple[str, ...] = ()
        self._bind_port = 0  # the extender's --bind-port, once started (0: none)
        self._extender_kubeconfig: Path | None = None
        self._operator_call: tuple[float, tuple[str, ...], ChartIdentities | None, bool] | None = (
            None
        )

    # ------------------------------------------------------------------ state
    def load_state(self) -> ClusterRecord | None:
        """The cluster's `state.json`, or None when it is missing or unreadable."""
        try:
            data = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return None
        return ClusterRecord(**data)

    def _save(self, state: ClusterRecord) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_file)

    def running(self) -> dict[str, bool]:
        """Each recorded process by name, and whether it still runs; empty without a state file."""
        state = self.load_state()
        if state is None:
            return {}
        return {p["name"]: process.is_alive(p["pid"], p["binary"]) for p in state.processes}

    # ------------------------------------------------------------------ up
    def up(
        self, spec: ClusterSpec | None = None, apiserver_port: int | None = None
    ) -> ClusterRecord:
        """Start every component and wait for it to be ready; on failure leave nothing running."""
        alive = self.running()
        if alive and all(alive.values()):
            raise ClusterError(
                f"cluster {self.name!r} is already running (state in {self.directory}); "
                f"run `chronotope dev cluster down --name {self.name}` first"
            )
        if alive:
            log.warning("cluster %s has leftovers of an earlier run; cleaning up", self.name)
        self.down(quiet=True)
        if apiserver_port is not None and not process.port_is_free(apiserver_port):
            raise ClusterError(f"port {apiserver_port} is already in use; choose another --port")
        binaries = ensure_binaries(self.settings)
        self.directory.mkdir(parents=True, exist_ok=True)
        ports = components.Ports(
            etcd_client=process.free_port(),
            etcd_peer=process.free_port(),
            apiserver=apiserver_port or process.free_port(),
            controller_manager=process.free_port(),
            scheduler=process.free_port(),
            kwok=process.free_port(),
        )
        state = ClusterRecord(
            name=self.name,
            directory=str(self.directory),
            ports=asdict(ports),
            spec_name=spec.name if spec else None,
        )
        self._save(state)
        try:
            self._start_all(state, ports, binaries)
            self.install_assignment_policy()
            if spec is not None:
                self.add_nodes(spec)
        except BaseException:
            self.down(quiet=True)
            raise
        return state

    def _start(
        self, state: ClusterRecord, name: str, argv: list[str], ready_url: str
    ) -> process.Started:
        started = process.start(name, argv, self.directory / "logs" / f"{name}.log")
        state.processes.append(started.record() | {"ready": ready_url})
        self._save(state)
        return started

    def _start_all(self, state: ClusterRecord, ports: components.Ports, b: Binaries) -> None:
        timeout = self.settings.ready_timeout
        pki = generate_pki(self.directory / "pki")
        kubeconfig = write_kubeconfig(state.kubeconfig, self.name, state.server, pki)
        data_dir = self.directory / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)

        etcd_ready = f"http://127.0.0.1:{ports.etcd_client}/health"
        etcd = self._start(state, "etcd", components.etcd_argv(b.etcd, data_dir, ports), etcd_ready)
        process.wait_until(etcd, lambda: _get(etcd_ready), timeout)

        apiserver = self._start(
            state,
            "kube-apiserver",
            components.apiserver_argv(b.kube_apiserver, pki, ports, self.directory),
            f"{state.server}/readyz",
        )
        process.wait_until(apiserver, lambda: self._apiserver_ready(state, pki), timeout)

        sched_config = self._scheduler_config(kubeconfig)
        rest = (
            (
                "kube-controller-manager",
                components.controller_manager_argv(
                    b.kube_controller_manager, kubeconfig, pki, ports, self.settings.node_grace_s
                ),
                f"https://127.0.0.1:{ports.controller_manager}/healthz",
            ),
            (
                "kube-scheduler",
                components.scheduler_argv(b.kube_scheduler, sched_config, kubeconfig, ports),
                f"https://127.0.0.1:{ports.scheduler}/healthz",
            ),
            (
                "kwok",
                components.kwok_argv(
                    b.kwok, kubeconfig, ports, self.settings.kwok_stages, self.settings.node_lease_s
                ),
                f"http://127.0.0.1:{ports.kwok}/healthz",
            ),
        )
        started = [(self._start(state, name, argv, url), url) for name, argv, url in rest]
        for proc, url in started:
            ctx = _insecure() if url.startswith("https") else None
            process.wait_until(proc, lambda u=url, c=ctx: _get(u, c), timeout)  # type: ignore[misc]
        log.info("cluster %s is up at %s", self.name, state.server)

    def _apiserver_ready(self, state: ClusterRecord, pki: Pki) -> bool:
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        return _get(f"{state.server}/readyz", ctx)

    def _scheduler_config(self, kubeconfig: Path) -> Path:
        config = yaml.safe_load(self.settings.scheduler_config.read_text())
        config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
        config.setdefault("leaderElection", {})["leaderElect"] = False
        path = self.directory / "kube-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    # ------------------------------------------------------------------ extra components
    def start_component(
        self, name: str, argv: list[str], ready_url: str, timeout: float | None = None
    ) -> process.Started:
        """Start one more process that belongs to the cluster (`down` stops it too)."""
        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        self.stop_component(name)
        state = self.load_state()
        assert state is not None
        started = self._start(state, name, argv, ready_url)
        ctx = _insecure() if ready_url.startswith("https") else None
        try:
            process.wait_until(
                started, lambda: _get(ready_url, ctx), timeout or self.settings.ready_timeout
            )
        except process.ComponentError:
            self.stop_component(name)
            raise
        return started

    def stop_component(self, name: str) -> bool:
        """Stop the named component and drop it from the state; False if there is no state."""
        state = self.load_state()
        if state is None:
            return False
        keep, stopped = [], False
        for proc in state.processes:
            if proc["name"] == name:
                process.stop(int(proc["pid"]), str(proc["binary"]))
                stopped = True
            else:
                keep.append(proc)
        state.processes = keep
        self._save(state)
        return stopped

    @contextlib.contextmanager
    def killed(self, name: str) -> Iterator[process.Started]:
        """Crash a component for the duration of the block, then start it again as it was.

        For fault and chaos tests, and the same for every component the cluster
        recorded (etcd, kube-apiserver, the schedulers, kwok, the extender, the
        operator). On entry its process group gets SIGKILL, with no grace. On exit
        the recorded command line runs again: same ports, data directory,
        certificates and log (appended), in the same place of the state, so `down`
        still stops newest first. It is then waited for on the readiness URL it was
        started with. The block gets the dead process.

        Raises:
            ClusterError: The cluster is not running, has no such component, or
                recorded it without its command line (a state from an older version).
            process.ComponentError: It did not come back ready; the message has the
                last lines of its log.
        """
        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        old = next((p for p in state.processes if p["name"] == name), None)
        if old is None:
            running = ", ".join(p["name"] for p in state.processes)
            raise ClusterError(f"cluster {self.name!r} runs no {name!r} (it runs {running})")
        argv, ready = old.get("argv"), old.get("ready")
        if not argv or not ready:
            raise ClusterError(f"{name} was recorded without its command line; start it again")
        dead = process.Started(name, int(old["pid"]), str(old["binary"]), Path(old["log"]))
        process.kill(dead.pid, dead.binary)
        try:
            yield dead
        finally:
            started = process.start(name, argv, Path(old["log"]))
            state = self.load_state()
            assert state is not None
            state.processes = [
                started.record() | {"ready": ready} if p["name"] == name else p
                for p in state.processes
            ]
            self._save(state)
            ctx = _insecure() if ready.startswith("https") else None
            process.wait_until(
                started, lambda: _get(ready, ctx), self.settings.ready_timeout, "ready again"
            )

    def restart_component(self, name: str) -> None:
        """Crash a component and start it again at once (`killed` with an empty block)."""
        with self.killed(name):
            pass

    def start_chronotope_scheduler(
        self,
        extender_port: int | None = None,
        extender_args: tuple[str, ...] = (),
        identities: ChartIdentities | None = None,
    ) -> int:
        """Run the Chronotope extender and a kube-scheduler with the `chronotope` profile.

        Returns the extender's port. The extender runs as `python -m chronotope
        scheduler` from this interpreter, so it is the code under test;
        `extender_args` go on its command line (`--policy fgd`, ...). With
        `identities`, both run as the chart's scheduler ServiceAccount (the chart
        binds it the extender's role and the built-in system:kube-scheduler roles);
        without, as cluster-admin. kube-scheduler calls the extender over HTTPS with
        the client certificate of `extender_pki()`, as the chart's does.
        """
        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        port = extender_port or process.free_port()
        self._extender_args = extender_args
        self._bind_port = process.free_port()
        kubeconfig = identities.kubeconfig("scheduler") if identities else state.kubeconfig
        self._extender_kubeconfig = kubeconfig
        self._start_extender(state, port)
        binaries = ensure_binaries(self.settings, build=False)
        config = yaml.safe_load(self.settings.chronotope_scheduler_config.read_text())
        config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
        config.setdefault("leaderElection", {})["leaderElect"] = False
        tls = self.extender_pki().tls_config()
        for extender in config.get("extenders", []):
            # the entry that only binds calls the extender's --bind-port (the config's comment)
            binds_only = "bindVerb" in extender and "filterVerb" not in extender
            at = self._bind_port if binds_only else port
            extender.update(urlPrefix=f"https://127.0.0.1:{at}", enableHTTPS=True, tlsConfig=tls)
        path = self.directory / "chronotope-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        sched_port = process.free_port()
        ports = dataclasses.replace(components.Ports(**state.ports), scheduler=sched_port)
        self.start_component(
            "chronotope-kube-scheduler",
            components.scheduler_argv(binaries.kube_scheduler, path, kubeconfig, ports),
            f"https://127.0.0.1:{sched_port}/healthz",
        )
        return port

    def install_assignment_policy(self) -> None:
        """Install the policy that lets only the scheduler write GPU assignments (as admin).

        manifests/security/assignment-policy.yaml is the chart's policy for the
        default release: it trusts the chart's scheduler ServiceAccount (what the
        extender runs as with `chart_identities()`) and system:masters (what it runs
        as without); docs/security.md.
        """
        from chronotope.kube.admission import apply_admission_objects
        from chronotope.kube.admission_policy import load_admission_policies
        from chronotope.kube.client import api_client

        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        path = self.settings.repo_root / "manifests" / "security" / "assignment-policy.yaml"
        with api_client(state.kubeconfig) as api:
            apply_admission_objects(api, load_admission_policies(path))

    def chart_identities(
        self, release: str = DEFAULT_RELEASE, namespace: str = DEFAULT_NAMESPACE
    ) -> ChartIdentities:
        """Apply the Helm chart's ServiceAccounts and RBAC; a token kubeconfig per component.

        Pass the result to `start_operator` / `start_chronotope_scheduler` to run
        them under the chart's identities (devcluster.identities).
        """
        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        return setup_chart_identities(
            state.kubeconfig,
            ensure_binaries(self.settings, build=False).helm,
            self.settings.repo_root / "charts" / "chronotope",
            self.directory / "identities",
            kube_version=self.settings.k8s_version,
            release=release,
            namespace=namespace,
        )

    def start_operator(
        self,
        interval: float = 1.0,
        extra_args: tuple[str, ...] = (),
        identities: ChartIdentities | None = None,
        webhook: bool = True,
    ) -> None:
        """Install the CRDs and run the Chronotope controllers (`python -m chronotope operator`).

        Its Prometheus metrics port is kept in the state (`operator_metrics_port`).
        The CRDs are installed as cluster-admin; with `identities` the operator
        process runs as the chart's operator ServiceAccount (else as cluster-admin).
        With `webhook`, it serves the admission webhook on a free loopback port
        (`operator_webhook_port`) with a self-signed certificate in `webhook/`, and
        the webhook is registered (`register_webhooks`); without, any earlier
        registration is removed. `restart_operator` repeats this call.
        """
        self._operator_call = (interval, extra_args, identities, webhook)
        from chronotope.kube.client import api_client
        from chronotope.kube.crds import install_crds

        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        crds = [
            yaml.safe_load(path.read_text())
            for path in sorted((self.settings.repo_root / "crds").glob("*.yaml"))
        ]
        with api_client(state.kubeconfig) as api:
            install_crds(api, crds)
        port, metrics_port = process.free_port(), process.free_port()
        state.operator_metrics_port = metrics_port
        state.operator_webhook_port = process.free_port() if webhook else None
        self._save(state)
        webhook_args = (
            [
                *("--webhook-port", str(state.operator_webhook_port)),
                *("--webhook-address", "127.0.0.1", "--webhook-host", "127.0.0.1"),
                *("--webhook-cert-dir", str(self.directory / "webhook")),
            ]
            if webhook
            else []
        )
        self.start_component(
            "chronotope-operator",
            [
                sys.executable,
                "-m",
                "chronotope",
                "operator",
                "--kubeconfig",
                str(identities.kubeconfig("operator") if identities else state.kubeconfig),
                "--health-port",
                str(port),
                "--interval",
                str(interval),
                "--metrics-port",
                str(metrics_port),
                "--metrics-address",
                "127.0.0.1",
                *webhook_args,
                *extra_args,
            ],
            f"http://127.0.0.1:{port}/healthz",
        )
        if webhook:
            self.register_webhooks()
        else:
            from chronotope.kube.admission import delete_webhook_configurations

            with api_client(state.kubeconfig) as api:
                delete_webhook_configurations(api, WEBHOOK_NAME)

    def restart_operator(self) -> None:
        """Stop the operator and start it again as the last `start_operator` call did."""
        if self._operator_call is None:
            raise ClusterError("the operator was not started by this LocalCluster")
        interval, extra_args, identities, webhook = self._operator_call
        self.start_operator(interval, extra_args, identities, webhook)

    def register_webhooks(
        self, failure_policy: str = "Fail", timeout_seconds: int = 5, *, wait: bool = True
    ) -> None:
        """Register the operator's admission webhook with the API server.

        The clientConfig is `https://127.0.0.1:<operator_webhook_port>` with the CA
        the operator generated (`webhook/ca.crt`). With `wait`, first waits until
        the webhook answers over TLS with that CA, and afterwards until the API
        server applies the registration (a dry-run create is validated and
        defaulted). Failure policy and timeout as docs/webhook.md.
        """
        from chronotope.kube.admission import apply_admission_objects
        from chronotope.kube.client import api_client
        from chronotope.workloads.admission_wire import webhook_configurations

        state = self.load_state()
        if state is None or state.operator_webhook_port is None:
            raise ClusterError(f"cluster {self.name!r} runs no operator with a webhook")
        ca = self.directory / "webhook" / "ca.crt"
        url = f"https://127.0.0.1:{state.operator_webhook_port}"
        started = None
        if wait:
            running = next(p for p in state.processes if p["name"] == "chronotope-operator")
            started = process.Started(
                "chronotope-operator",
                int(running["pid"]),
                str(running["binary"]),
                Path(running["log"]),
            )
            process.wait_until(
                started,
                lambda: _get(f"{url}/healthz", ssl.create_default_context(cafile=str(ca))),
                self.settings.ready_timeout,
            )
        client_config = {"url": url, "caBundle": base64.b64encode(ca.read_bytes()).decode()}
        objs = webhook_configurations(
            WEBHOOK_NAME,
            client_config,
            failure_policy=failure_policy,
            timeout_seconds=timeout_seconds,
        )
        with api_client(state.kubeconfig) as api:
            apply_admission_objects(api, objs)
            if started is not None:
                process.wait_until(
                    started, lambda: _webhooks_in_effect(api), self.settings.ready_timeout
                )

    def extender_pki(self) -> ExtenderPki:
        """The extender's CA and certificates (`extender-pki/`, made once per cluster).

        `client_context()` calls the extender as kube-scheduler does.
        """
        return extender_pki(self.directory / "extender-pki")

    def _start_extender(self, state: ClusterRecord, port: int) -> None:
        self.start_component(
            "chronotope-extender",
            [
                sys.executable,
                "-m",
                "chronotope",
                "scheduler",
                "--kubeconfig",
                str(self._extender_kubeconfig or state.kubeconfig),
                "--port",
                str(port),
                *(("--bind-port", str(self._bind_port)) if self._bind_port else ()),
                *self.extender_pki().server_args(),
                *self._extender_args,
            ],
            f"https://127.0.0.1:{port}/healthz",
        )

    def restart_extender(self, port: int) -> None:
        """Kill the extender hard and start it again on the same port (fault tests)."""
        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        self.stop_component("chronotope-extender")
        self._start_extender(state, port)

    # ------------------------------------------------------------------ nodes
    def add_nodes(self, spec: ClusterSpec) -> int:
        """Create the spec's simulated GPU nodes and wait for kwok to mark them Ready."""
        from chronotope.kube.client import api_client
        from chronotope.kube.nodes import apply_nodes, wait_nodes_ready

        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        manifests = node_manifests(spec)
        with api_client(state.kubeconfig) as api:
            count = apply_nodes(api, manifests)
            wait_nodes_ready(
                api, {m["metadata"]["name"] for m in manifests}, self.settings.ready_timeout
            )
        log.info("cluster %s: %d nodes from spec %s are Ready", self.name, count, spec.name)
        return count

    # ------------------------------------------------------------------ down
    def down(self, *, quiet: bool = False, purge: bool = False) -> bool:
        """Stop every recorded process (newest first). Returns False if nothing was recorded."""
        state = self.load_state()
        if state is None:
            if not quiet:
                log.info("cluster %s: nothing to stop", self.name)
            return False
        for proc in reversed(state.processes):
            process.stop(int(proc["pid"]), str(proc["binary"]))
        state.processes = []
        self._save(state)
        if purge:
            shutil.rmtree(self.directory, ignore_errors=True)
        if not quiet:
            log.info("cluster %s stopped", self.name)
        return True
