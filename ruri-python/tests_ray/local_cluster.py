"""A real Ray cluster of several nodes on this machine, started with `ray start` (for
tests_ray/ and tools/bench/ray_bench.py).

Each node is a `ray start --block` process (one CPU; optionally pinned to a core with
taskset), on ports picked free and a temp dir of its own, so it never joins or stops another
Ray on the machine; no dashboard. Stopping a node's process (SIGTERM, then SIGKILL to its
process group) stops the node; any Ray process left that names our temp dir on its command
line is then killed by its PID. Never `ray stop`, which would stop every Ray of the user.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

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

    def _start(self, name: str, args: list, core: Optional[int] = None) -> None:
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
        if core is not None:
            command = ["taskset", "-c", str(core)] + command
        self.processes.append(subprocess.Popen(command + args, stdout=log,
                                               stderr=subprocess.STDOUT,
                                               start_new_session=True))

    def start(self, pin: bool = False) -> None:
        """A head and a worker node of one CPU each; with `pin`, on cores 0 and 1."""
        import ray

        self._start("head", [], 0 if pin else None)
        self._wait_nodes(1)
        self._start("worker", [], 1 if pin else None)
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
                    process.wait(timeout=5)
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
