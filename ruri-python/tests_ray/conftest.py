"""A real two-node Ray cluster on this machine, for the ruri.ray tests.

Two `ray start` processes (a head and a worker node, one CPU each, no dashboard), on ports
picked free and a temp dir of their own, so they never join or stop another Ray on the
machine. `--block` keeps each in the foreground: stopping it (SIGTERM, then SIGKILL to its
process group) stops its node; any Ray process left that names our temp dir on its command
line is then killed by its PID. The cluster lives for the test session and is stopped in
teardown, whatever the tests did.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "testdata" / "tiny"
RAY = str(Path(sys.executable).with_name("ray"))

# Token authentication (Ray >= 2.5x) would write a token into ~/.ray: off for a loopback test.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def free_ports(n: int) -> list:
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class Cluster:
    def __init__(self) -> None:
        # Short: Ray puts unix sockets under it (108-byte path limit).
        self.temp_dir = tempfile.mkdtemp(prefix="ruri-ray-", dir="/tmp")
        self.processes = []
        self.logs = []
        self.address = None

    def _start(self, name: str, args: list) -> None:
        (gcs_or_node, manager, objects, agent, agent_grpc, metrics,
         runtime_env) = free_ports(7)
        command = [RAY, "start", "--block", "--num-cpus=1", "--node-ip-address=127.0.0.1",
                   "--disable-usage-stats",
                   f"--temp-dir={self.temp_dir}",
                   "--object-store-memory=150000000",
                   f"--node-manager-port={manager}", f"--object-manager-port={objects}",
                   f"--dashboard-agent-listen-port={agent}",
                   f"--dashboard-agent-grpc-port={agent_grpc}",
                   f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
                   # 0: workers take any free port, so the two nodes never collide.
                   "--min-worker-port=0", "--max-worker-port=0"]
        if name == "head":
            self.address = f"127.0.0.1:{gcs_or_node}"
            command += ["--head", f"--port={gcs_or_node}", "--include-dashboard=false"]
        else:
            command += [f"--address={self.address}"]
        log = open(Path(self.temp_dir) / f"{name}.log", "wb")
        self.logs.append(log)
        self.processes.append(subprocess.Popen(command + args, stdout=log,
                                               stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def start(self) -> None:
        import ray

        self._start("head", [])
        self._wait_nodes(1)
        self._start("worker", [])
        self._wait_nodes(2)
        ray.init(address=self.address, include_dashboard=False, log_to_driver=False)

    def _wait_nodes(self, n: int, timeout: float = 90) -> None:
        # `ray status` needs the dashboard here; ask the GCS through a throwaway driver.
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
                 "print(sum(1 for node in ray.nodes() if node['Alive']))")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"ray start exited with {process.returncode}: "
                                       f"{self.log_text()}")
            try:
                result = subprocess.run([sys.executable, "-c", probe, self.address],
                                        capture_output=True, text=True, timeout=20)
            except subprocess.TimeoutExpired:
                continue
            lines = result.stdout.strip().splitlines()
            if result.returncode == 0 and lines and int(lines[-1]) >= n:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the Ray cluster did not reach {n} nodes: {self.log_text()}")

    def log_text(self) -> str:
        for log in self.logs:
            log.flush()
        return "\n".join((Path(self.temp_dir) / f"{name}.log").read_text(errors="replace")
                         for name in ("head", "worker")
                         if (Path(self.temp_dir) / f"{name}.log").exists())

    def ours(self) -> list:
        """PIDs of processes whose command line names our temp dir (Ray's daemons do)."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if self.temp_dir.encode() in cmdline:
                pids.append(int(entry.name))
        return pids

    def stop(self) -> None:
        try:
            import ray

            ray.shutdown()
        finally:
            for process in reversed(self.processes):
                if process.poll() is None:
                    process.terminate()
            for process in reversed(self.processes):
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    pass
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            for pid in self.ours():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for log in self.logs:
                log.close()
            shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster():
    cluster = Cluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def make_texts(n: int) -> list:
    """n distinct texts of varied length, from the committed inputs (testdata/inputs.json)."""
    with (ROOT / "testdata" / "inputs.json").open(encoding="utf-8") as f:
        base = [item["text"] for item in json.load(f) if item["text"].strip()]
    return [f"{i}番: " + base[i % len(base)] * (1 + (i * 7) % 4) for i in range(n)]
