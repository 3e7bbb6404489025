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

import dataclasses
import json
import logging
import shutil
import ssl
import sys
import urllib.request
from dataclasses import asdict, dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import yaml

from chronotope.devcluster import components, process
from chronotope.devcluster.binaries import Binaries, ensure_binaries
from chronotope.devcluster.kubeconfig import write_kubeconfig
from chronotope.devcluster.pki import Pki, generate_pki
from chronotope.devcluster.settings import ClusterSettings
from chronotope.sim.clusterspec import ClusterSpec, node_manifests

__all__ = ["ClusterError", "ClusterRecord", "LocalCluster"]

log = logging.getLogger(__name__)


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
            if spec is not None:
                self.add_nodes(spec)
        except BaseException:
            self.down(quiet=True)
            raise
        return state

    def _start(self, state: ClusterRecord, name: str, argv: list[str]) -> process.Started:
        started = process.start(name, argv, self.directory / "logs" / f"{name}.log")
        state.processes.append(started.record())
        self._save(state)
        return started

    def _start_all(self, state: ClusterRecord, ports: components.Ports, b: Binaries) -> None:
        timeout = self.settings.ready_timeout
        pki = generate_pki(self.directory / "pki")
        kubeconfig = write_kubeconfig(state.kubeconfig, self.name, state.server, pki)
        data_dir = self.directory / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)

        etcd = self._start(state, "etcd", components.etcd_argv(b.etcd, data_dir, ports))
        process.wait_until(
            etcd, lambda: _get(f"http://127.0.0.1:{ports.etcd_client}/health"), timeout
        )

        apiserver = self._start(
            state,
            "kube-apiserver",
            components.apiserver_argv(b.kube_apiserver, pki, ports, self.directory),
        )
        process.wait_until(apiserver, lambda: self._apiserver_ready(state, pki), timeout)

        kcm = self._start(
            state,
            "kube-controller-manager",
            components.controller_manager_argv(b.kube_controller_manager, kubeconfig, pki, ports),
        )
        sched_config = self._scheduler_config(kubeconfig)
        sched = self._start(
            state,
            "kube-scheduler",
            components.scheduler_argv(b.kube_scheduler, sched_config, kubeconfig, ports),
        )
        kwok = self._start(state, "kwok", components.kwok_argv(b.kwok, kubeconfig, ports))
        for started, port, scheme in (
            (kcm, ports.controller_manager, "https"),
            (sched, ports.scheduler, "https"),
            (kwok, ports.kwok, "http"),
        ):
            url = f"{scheme}://127.0.0.1:{port}/healthz"
            ctx = _insecure() if scheme == "https" else None
            process.wait_until(started, lambda u=url, c=ctx: _get(u, c), timeout)  # type: ignore[misc]
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
        started = self._start(state, name, argv)
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

    def start_chronotope_scheduler(
        self, extender_port: int | None = None, extender_args: tuple[str, ...] = ()
    ) -> int:
        """Run the Chronotope extender and a kube-scheduler with the `chronotope` profile.

        Returns the extender's port. The extender runs as `python -m chronotope
        scheduler` from this interpreter, so it is the code under test;
        `extender_args` go on its command line (`--policy fgd`, ...).
        """
        state = self.load_state()
        if state is None:
            raise ClusterError(f"cluster {self.name!r} is not running")
        port = extender_port or process.free_port()
        self._extender_args = extender_args
        self._start_extender(state, port)
        binaries = ensure_binaries(self.settings, build=False)
        config = yaml.safe_load(self.settings.chronotope_scheduler_config.read_text())
        config.setdefault("clientConnection", {})["kubeconfig"] = str(state.kubeconfig)
        config.setdefault("leaderElection", {})["leaderElect"] = False
        for extender in config.get("extenders", []):
            extender["urlPrefix"] = f"http://127.0.0.1:{port}"
        path = self.directory / "chronotope-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        sched_port = process.free_port()
        ports = dataclasses.replace(components.Ports(**state.ports), scheduler=sched_port)
        self.start_component(
            "chronotope-kube-scheduler",
            components.scheduler_argv(binaries.kube_scheduler, path, state.kubeconfig, ports),
            f"https://127.0.0.1:{sched_port}/healthz",
        )
        return port

    def start_operator(self, interval: float = 1.0, extra_args: tuple[str, ...] = ()) -> None:
        """Install the CRDs and run the Chronotope controllers (`python -m chronotope operator`).

        Its Prometheus metrics port is kept in the state (`operator_metrics_port`).
        """
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
        self._save(state)
        self.start_component(
            "chronotope-operator",
            [
                sys.executable,
                "-m",
                "chronotope",
                "operator",
                "--kubeconfig",
                str(state.kubeconfig),
                "--health-port",
                str(port),
                "--interval",
                str(interval),
                "--metrics-port",
                str(metrics_port),
                "--metrics-address",
                "127.0.0.1",
                *extra_args,
            ],
            f"http://127.0.0.1:{port}/healthz",
        )

    def _start_extender(self, state: ClusterRecord, port: int) -> None:
        self.start_component(
            "chronotope-extender",
            [
                sys.executable,
                "-m",
                "chronotope",
                "scheduler",
                "--kubeconfig",
                str(state.kubeconfig),
                "--port",
                str(port),
                *self._extender_args,
            ],
            f"http://127.0.0.1:{port}/healthz",
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
