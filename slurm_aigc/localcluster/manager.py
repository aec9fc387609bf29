"""Brings the local cluster up and down: packages, munge, MariaDB, slurmdbd, slurmctld, one slurmd per node.

Every process we start is recorded by pid in `<state>/run/<name>.pid` (with its command
line), so `down` stops only what `up` started, and `up` skips what is already running.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_aigc.db import DEFAULT_URL_FILE, open_database, read_url_file, recreate_database, write_url_file
from slurm_aigc.errors import ClusterError
from slurm_aigc.localcluster import config
from slurm_aigc.localcluster.shape import ClusterShape, parse_shape, shape_to_text
from slurm_aigc.policy.paths import ENV_SIMGPU_DIR
from slurm_aigc.slurm import SlurmCli
from slurm_aigc.telemetry.simgpu import default_simgpu_dir

DEFAULT_STATE_DIR = Path("/var/lib/slurm-aigc/cluster")
SYSTEM_SLURM_CONF = Path("/etc/slurm/slurm.conf")
# python3-click/-yaml: jobs run `python3 -m slurm_aigc gpu-load` with Debian's Python (see job_runtime).
APT_PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server", "lua5.1", "liblua5.1-0",
                "python3-click", "python3-yaml")
REQUIRED_BINARIES = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "sacctmgr", "munged", "mariadbd", "luac5.1")
SYSTEM_PYTHON = Path("/usr/bin/python3")
NVIDIA_MAJOR = 195

Progress = Callable[[str], None]


def state_dir_default() -> Path:
    return Path(os.environ.get("SLURM_AIGC_CLUSTER_DIR", str(DEFAULT_STATE_DIR)))


@dataclass(frozen=True)
class ProcessStatus:
    name: str
    pid: int | None
    running: bool


# ---------------------------------------------------------------- packages

def missing_binaries() -> list[str]:
    missing = [b for b in REQUIRED_BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]
    if _run([str(SYSTEM_PYTHON), "-c", "import click, yaml"], check=False).returncode != 0:
        missing.append("python3-click/python3-yaml")
    return missing


def install_packages(progress: Progress) -> None:
    """`apt-get install` Debian's Slurm, munge, MariaDB and Lua, skipping what is installed."""
    if not missing_binaries():
        progress("packages: all present, skipping apt")
        return
    if os.geteuid() != 0:
        raise ClusterError("installing packages needs root")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    # Debian's postinst scripts would try to start services; there is no init system here.
    policy = Path("/usr/sbin/policy-rc.d")
    created_policy = not policy.exists()
    if created_policy:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        progress("packages: apt-get update")
        _run(["apt-get", "update", "-q"], env=env, timeout_s=600)
        progress(f"packages: apt-get install {' '.join(APT_PACKAGES)} (about a minute)")
        _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES], env=env, timeout_s=1200)
    finally:
        if created_policy:
            policy.unlink(missing_ok=True)
    if missing := missing_binaries():
        raise ClusterError(f"still missing after apt: {', '.join(missing)}")


def _run(argv: Sequence[str], *, env: dict[str, str] | None = None, timeout_s: float = 60, stdin: str | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} exited {result.returncode}: {(result.stderr or result.stdout).strip()[-800:]}")
    return result


def slurm_version() -> tuple[int, int, int]:
    text = _run(["slurmd", "-V"]).stdout
    parts = text.split()[-1].split(".")
    return int(parts[0]), int(parts[1]), int("".join(c for c in parts[2] if c.isdigit()) or 0)


# ---------------------------------------------------------------- processes

class ProcessTable:
    """Pid files of the processes `up` started: `<run>/<name>.pid` holds pid and argv."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def _file(self, name: str) -> Path:
        return self.run_dir / f"{name}.proc.json"

    def alive(self, name: str) -> bool:
        pid = self.pid(name)
        return pid is not None and _pid_alive(pid)

    def pid(self, name: str) -> int | None:
        try:
            return int(json.loads(self._file(name).read_text())["pid"])
        except (OSError, ValueError, KeyError):
            return None

    def start(self, name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> int:
        # The daemons outlive the command that started them: run them in the run directory, not
        # in the caller's. A slurmd left in a deleted checkout made every job step fail
        # `getcwd` (slurmstepd inherits the directory) until the cluster was restarted.
        with open(log, "ab") as out:
            process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env=env, cwd=self.run_dir)
        self._file(name).write_text(json.dumps({"pid": process.pid, "argv": list(argv)}))
        return process.pid

    def names(self) -> list[str]:
        return sorted(p.name.removesuffix(".proc.json") for p in self.run_dir.glob("*.proc.json"))

    def stop(self, name: str, timeout_s: float = 15.0) -> bool:
        """SIGTERM our process, SIGKILL it after `timeout_s`; True if it was running."""
        pid = self.pid(name)
        self._file(name).unlink(missing_ok=True)
        if pid is None or not _pid_alive(pid):
            return False
        os.kill(pid, signal.SIGTERM)
        if not _wait(lambda: not _pid_alive(pid), timeout_s):
            os.kill(pid, signal.SIGKILL)
            _wait(lambda: not _pid_alive(pid), 5)
        return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------- the cluster

class LocalCluster:
    """The local cluster described by `state_dir`: `up()`, `down()`, `status()`."""

    def __init__(self, state_dir: Path | None = None, simgpu_dir: Path | None = None,
                 progress: Progress = lambda message: None) -> None:
        self.state_dir = (state_dir or state_dir_default()).resolve()
        # The agents' default (telemetry.simgpu), so a cluster and its agents agree without flags.
        self.simgpu_dir = (simgpu_dir or default_simgpu_dir()).resolve()
        self.progress = progress
        self.processes = ProcessTable(self.state_dir / "run")
        self.slurm = SlurmCli()

    # ---- public
    @property
    def ready_file(self) -> Path:
        return self.state_dir / "READY"

    @property
    def etc_dir(self) -> Path:
        return self.state_dir / "etc"

    def db_url_file(self, role: str) -> Path:
        """The credentials file (0600) with the URL of slurm-aigc's database for `role`
        (controller | agent | test); /etc/slurm-aigc/db.url points at the controller's."""
        return self.etc_dir / "db" / f"{role}.url"

    def scratch_database(self, name: str) -> str:
        """A fresh, empty database `slurm_aigc_scratch_<name>` on the cluster's MariaDB (dropped and
        created again); returns its URL file's path, to pass as `--db` (no password in argv)."""
        url = recreate_database(read_url_file(self.db_url_file("test")), config.SCRATCH_DATABASE_PREFIX + name)
        path = self.db_url_file(f"scratch-{name}")
        write_url_file(path, url)
        return str(path)

    def is_up(self) -> bool:
        """Brought up (ready) and every process it started still alive (not, say, after a reboot)."""
        names = self.processes.names()
        return self.ready_file.exists() and bool(names) and all(self.processes.alive(name) for name in names)

    def shape(self) -> ClusterShape:
        try:
            return parse_shape((self.state_dir / "shape").read_text().strip())
        except OSError as error:
            raise ClusterError(f"no cluster in {self.state_dir}: run `slurm-aigc cluster up`") from error

    def up(self, shape_text: str | None = None, *, install: bool = True, timeout_s: float = 120,
           replace: bool = False) -> ClusterShape:
        """Start the cluster in `shape_text` (default: the last shape, else the default shape).

        A cluster already up in another shape is an error unless `replace`, which stops it first.
        """
        started = time.monotonic()
        if install:
            install_packages(self.progress)
        shape = parse_shape(shape_text or self._saved_shape_text() or parse_shape_default())
        if must_stop_first(self._saved_shape_text(), self.is_up(), shape_to_text(shape), replace=replace):
            self.progress(f"cluster was {self._saved_shape_text()}; stopping it to start {shape_to_text(shape)}")
            self.down()
        layout = config.Layout(self.state_dir, socket.gethostname().split(".")[0], slurm_version())
        self.ready_file.unlink(missing_ok=True)
        self._prepare(shape, layout)
        self._start_munge()
        self._start_mariadb(layout)
        self._start_slurmdbd(layout)
        self._ensure_accounting()
        self._start_slurmctld(layout)
        self._start_slurmds(shape, layout)
        self._wait_nodes_idle(shape, timeout_s)
        self._write_simgpu(shape)
        self._install_job_runtime()
        self.ready_file.write_text(f"{time.time():.0f}\n")
        self.progress(f"cluster up: {len(shape.nodes)} nodes, {shape.total_gpus} GPUs in {time.monotonic() - started:.1f} s")
        return shape

    def down(self, purge: bool = False) -> list[str]:
        """Stop what `up` started (slurmd first, MariaDB last); `purge` removes all state."""
        self.ready_file.unlink(missing_ok=True)
        order = [n for n in self.processes.names() if n.startswith("slurmd-")] + ["slurmctld", "slurmdbd", "mariadb", "munged"]
        stopped = [name for name in order if self.processes.stop(name)]
        for name in stopped:
            self.progress(f"stopped {name}")
        if purge:
            self._unlink_system_conf()
            shutil.rmtree(self.state_dir, ignore_errors=True)
            shutil.rmtree(self.simgpu_dir, ignore_errors=True)
            self.progress(f"purged {self.state_dir} and {self.simgpu_dir}")
        return stopped

    def status(self) -> list[ProcessStatus]:
        return [ProcessStatus(name, self.processes.pid(name), self.processes.alive(name)) for name in self.processes.names()]

    # ---- steps
    def _saved_shape_text(self) -> str | None:
        path = self.state_dir / "shape"
        return path.read_text().strip() if path.exists() else None

    def _prepare(self, shape: ClusterShape, layout: config.Layout) -> None:
        for directory in (layout.etc, layout.log, layout.run, layout.spool / "ctld", layout.dev):
            directory.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "shape").write_text(shape_to_text(shape) + "\n")
        for node in shape.nodes:
            (layout.spool / f"slurmd-{node.name}").mkdir(parents=True, exist_ok=True)
            for index in range(node.gpu_count):
                _make_char_device(layout.gpu_device(node.name, index), NVIDIA_MAJOR, index)
        _write_if_changed(layout.slurm_conf, config.render_slurm_conf(shape, layout))
        _write_if_changed(layout.etc / "gres.conf", config.render_gres_conf(shape, layout))
        _write_if_changed(layout.etc / "cgroup.conf", config.render_cgroup_conf(layout))
        dbd_conf = layout.etc / "slurmdbd.conf"
        _write_if_changed(dbd_conf, config.render_slurmdbd_conf(layout, self._db_password()))
        dbd_conf.chmod(0o600)
        hook = layout.etc / "job_submit.lua"
        if not hook.exists():
            hook.write_text(config.NOOP_HOOK_LUA)
        self._link_system_conf(layout.slurm_conf)
        for user in config.TEST_USERS:
            if _run(["id", user], check=False).returncode != 0:
                _run(["useradd", "--create-home", "--shell", "/bin/bash", user])
        self.progress(f"config written to {layout.etc}")

    def _db_password(self) -> str:
        path = self.state_dir / "db-password"
        if not path.exists():
            path.write_text(secrets.token_hex(12))
            path.chmod(0o600)
        return path.read_text().strip()

    def _link_system_conf(self, target: Path) -> None:
        """Point /etc/slurm/slurm.conf at ours so plain `sbatch` works; never clobber a real file."""
        SYSTEM_SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        if SYSTEM_SLURM_CONF.is_symlink() or not SYSTEM_SLURM_CONF.exists():
            SYSTEM_SLURM_CONF.unlink(missing_ok=True)
            SYSTEM_SLURM_CONF.symlink_to(target)
        elif SYSTEM_SLURM_CONF.resolve() != target:
            raise ClusterError(f"{SYSTEM_SLURM_CONF} is a real file (a configured Slurm?); not touching it")

    def _unlink_system_conf(self) -> None:
        for link in (SYSTEM_SLURM_CONF, DEFAULT_URL_FILE):
            if link.is_symlink() and link.resolve().is_relative_to(self.state_dir):
                link.unlink()

    def _start_munge(self) -> None:
        if _run(["sh", "-c", "munge -n | unmunge"], check=False).returncode == 0:
            self.progress("munge: already answering")
            return
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            _run(["mungekey", "--create"])
            shutil.chown(key, "munge", "munge")
        self.processes.start("munged", ["runuser", "-u", "munge", "--", "munged", "--foreground"],
                             self.state_dir / "log" / "munged.log")
        if not _wait(lambda: _run(["sh", "-c", "munge -n | unmunge"], check=False).returncode == 0, 15):
            raise ClusterError("munged did not start: see log/munged.log")
        self.progress("munge: started")

    def _start_mariadb(self, layout: config.Layout) -> None:
        socket_path = layout.run / "mysqld.sock"
        if not self.processes.alive("mariadb"):
            if not (layout.mysql_data / "mysql").exists():
                self.progress("mariadb: initialising data directory")
                layout.mysql_data.mkdir(parents=True, exist_ok=True)
                shutil.chown(layout.mysql_data, "mysql", "mysql")
                _run(["mariadb-install-db", "--user=mysql", f"--datadir={layout.mysql_data}",
                      "--auth-root-authentication-method=socket", "--skip-test-db"], timeout_s=180)
            shutil.chown(layout.run, "root", "mysql")
            layout.run.chmod(0o775)
            self.processes.start("mariadb", [
                "mariadbd", "--user=mysql", f"--datadir={layout.mysql_data}", f"--socket={socket_path}",
                f"--port={layout.mysql_port}", "--bind-address=127.0.0.1", f"--pid-file={layout.run}/mysqld.pid",
                "--innodb-buffer-pool-size=64M", "--innodb-lock-wait-timeout=900", "--skip-name-resolve",
            ], layout.log / "mariadb.log")
        if not _wait(lambda: _port_open(layout.mysql_port) and socket_path.exists(), 60):
            raise ClusterError("mariadb did not start: see log/mariadb.log")
        password = self._db_password()
        sql = (f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
               f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';"
               "CREATE DATABASE IF NOT EXISTS slurm_acct_db;"
               "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';")
        _run(["mariadb", f"--socket={socket_path}", "-u", "root", "-e", sql])
        self._load_time_zones(socket_path)
        self._ensure_aigc_database(layout, socket_path)
        self.progress("mariadb: up")

    def _load_time_zones(self, socket_path: Path) -> None:
        """MariaDB's named time zones, as sites load them (once): the tests' database clock read
        runs in a zone with DST, which mariadb-install-db leaves out."""
        mariadb = ["mariadb", f"--socket={socket_path}", "-u", "root"]
        if _run([*mariadb, "-N", "-e", "SELECT COUNT(*) FROM mysql.time_zone_name"]).stdout.strip() != "0":
            return
        zones = _run(["mariadb-tzinfo-to-sql", "/usr/share/zoneinfo"], timeout_s=120).stdout
        _run([*mariadb, "mysql"], stdin=zones, timeout_s=120)
        self.progress("mariadb: time zones loaded")

    def _ensure_aigc_database(self, layout: config.Layout, socket_path: Path) -> None:
        """slurm-aigc's database and roles, its schema (created as the controller), the agent's
        grants and the URL files (idempotent). SQL goes on stdin: no password in argv."""
        mariadb = ["mariadb", f"--socket={socket_path}", "-u", "root"]
        passwords = {role: self._secret(f"db-password-{role}") for role in config.DB_ROLES}
        _run(mariadb, stdin=config.render_aigc_users_sql(passwords))
        for role, password in passwords.items():
            database = config.TEST_DATABASE_PREFIX + "x" if role == "test" else config.AIGC_DATABASE
            write_url_file(self.db_url_file(role), config.aigc_db_url(layout, role, password, database))
        open_database(str(self.db_url_file("controller")))
        _run(mariadb, stdin=config.render_agent_grants_sql())
        self._link_system_db_url(self.db_url_file("controller"))
        self.progress(f"mariadb: database {config.AIGC_DATABASE} ready (URL files in {self.db_url_file('agent').parent})")

    def _secret(self, name: str) -> str:
        path = self.state_dir / name
        if not path.exists():
            write_url_file(path, secrets.token_hex(16))
        return path.read_text().strip()

    def _link_system_db_url(self, target: Path) -> None:
        """Point /etc/slurm-aigc/db.url (the default database) at the cluster's; never clobber a real file."""
        DEFAULT_URL_FILE.parent.mkdir(parents=True, exist_ok=True)
        if DEFAULT_URL_FILE.is_symlink() or not DEFAULT_URL_FILE.exists():
            DEFAULT_URL_FILE.unlink(missing_ok=True)
            DEFAULT_URL_FILE.symlink_to(target)
        elif DEFAULT_URL_FILE.resolve() != target:
            self.progress(f"{DEFAULT_URL_FILE} is a real file; leaving it (the cluster's URL is in {target})")

    def _start_slurmdbd(self, layout: config.Layout) -> None:
        if not self.processes.alive("slurmdbd"):
            env = dict(os.environ, SLURM_CONF=str(layout.slurm_conf))
            self.processes.start("slurmdbd", ["slurmdbd", "-D"],
                                 layout.log / "slurmdbd.stdout", env)
        if not _wait(lambda: _port_open(layout.dbd_port) or not self.processes.alive("slurmdbd"), 60) \
                or not self.processes.alive("slurmdbd"):
            raise ClusterError(f"slurmdbd did not start: see {layout.log}/slurmdbd.log")
        self.progress("slurmdbd: up")

    def _ensure_accounting(self) -> None:
        """Cluster, account and test users in slurmdbd: asks sacctmgr what exists, adds the rest.

        Decides on `sacctmgr -nP show` output, never on the wording of `add`'s messages, which
        changed in 24.11 ("Already existing account ...", "Nothing added.", exit 1).
        """
        for argv in accounting_additions(*self._accounting_listing()):
            result = _run(["sacctmgr", "-i", *argv], check=False, timeout_s=60)
            if result.returncode != 0:
                self.progress(f"accounting: sacctmgr {' '.join(argv)} exited {result.returncode}; re-checking")
        still = accounting_additions(*self._accounting_listing())
        if still:
            raise ClusterError("sacctmgr could not add: " + "; ".join(" ".join(argv) for argv in still))
        self.progress("accounting: cluster, account and users present")

    @staticmethod
    def _accounting_listing() -> tuple[str, str]:
        """`sacctmgr -nP show cluster format=cluster` and `... show assoc format=cluster,account,user`."""
        clusters = _run(["sacctmgr", "-nP", "show", "cluster", "format=cluster"], timeout_s=60).stdout
        assocs = _run(["sacctmgr", "-nP", "show", "assoc", "format=cluster,account,user",
                       "where", f"cluster={config.CLUSTER_NAME}"], timeout_s=60).stdout
        return clusters, assocs

    def _start_slurmctld(self, layout: config.Layout) -> None:
        env = dict(os.environ, SLURM_CONF=str(layout.slurm_conf))
        if self.processes.alive("slurmctld"):
            _run(["scontrol", "reconfigure"], check=False)
        else:
            self.processes.start("slurmctld", ["slurmctld", "-D", "-i", "-f", str(layout.slurm_conf)],
                                 layout.log / "slurmctld.stdout", env)
        if not _wait(lambda: self.slurm.ping() or not self.processes.alive("slurmctld"), 60) or not self.slurm.ping():
            raise ClusterError(f"slurmctld did not answer: see {layout.log}/slurmctld.log")
        self.progress("slurmctld: up")

    def _start_slurmds(self, shape: ClusterShape, layout: config.Layout) -> None:
        env = {**os.environ, "SLURM_CONF": str(layout.slurm_conf), ENV_SIMGPU_DIR: str(self.simgpu_dir)}
        for node in shape.nodes:
            name = f"slurmd-{node.name}"
            if not self.processes.alive(name):
                self.processes.start(name, ["slurmd", "-D", "-N", node.name, "-f", str(layout.slurm_conf)],
                                     layout.log / f"{name}.stdout", env)
        self.progress(f"slurmd: {len(shape.nodes)} nodes started")

    def _wait_nodes_idle(self, shape: ClusterShape, timeout_s: float) -> None:
        names = {node.name for node in shape.nodes}

        def all_idle() -> bool:
            states = {n.name: n.state for n in self.slurm.nodes() if n.name in names}
            for name, state in states.items():
                if "DOWN" in state or "DRAIN" in state:
                    self.slurm.run("scontrol", ["update", f"NodeName={name}", "State=RESUME"])
            return len(states) == len(names) and all(s.split("+")[0] in {"IDLE", "MIXED", "ALLOCATED"} for s in states.values())

        if not _wait(all_idle, timeout_s, 0.5):
            states = ", ".join(f"{n.name}={n.state}" for n in self.slurm.nodes())
            raise ClusterError(f"nodes not idle after {timeout_s:.0f} s: {states}")
        self.progress("nodes: all idle")

    @property
    def job_runtime_dir(self) -> Path:
        return self.state_dir / "runtime"

    def job_command(self) -> list[str]:
        """How a job of any user runs slurm-aigc (e.g. `gpu-load`) on the local cluster.

        The developer's virtualenv usually lives where job users cannot read it (pyenv under
        /root), so `up` copies the package beside the cluster state and jobs run it with
        Debian's python3 and its python3-click/python3-yaml.
        """
        return ["env", f"PYTHONPATH={self.job_runtime_dir}", f"{ENV_SIMGPU_DIR}={self.simgpu_dir}",
                str(SYSTEM_PYTHON), "-m", "slurm_aigc"]

    def _install_job_runtime(self) -> None:
        package = Path(__file__).resolve().parents[1]
        target = self.job_runtime_dir / "slurm_aigc"
        staging = self.job_runtime_dir / "slurm_aigc.new"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(package, staging, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        for directory in (self.state_dir, self.job_runtime_dir):
            directory.chmod(0o755)

    def _write_simgpu(self, shape: ClusterShape) -> None:
        from slurm_aigc.localcluster.simgpu_inventory import write_inventories
        write_inventories(shape, self.simgpu_dir)


def accounting_additions(clusters: str, assocs: str) -> list[list[str]]:
    """The `sacctmgr add ...` argv lists that bring accounting to our cluster, account and users.

    `clusters` is `sacctmgr -nP show cluster format=cluster`; `assocs` is `sacctmgr -nP show assoc
    format=cluster,account,user` (`cluster|account|user`, user empty for the account's own row);
    the same on 22.05 through 24.11.
    """
    have_clusters = {line.strip() for line in clusters.splitlines() if line.strip()}
    have_assocs = {tuple(line.split("|")[:3]) for line in assocs.splitlines() if line.count("|") >= 2}
    cluster, account = config.CLUSTER_NAME, config.ACCOUNT
    argvs: list[list[str]] = []
    if cluster not in have_clusters:
        argvs.append(["add", "cluster", cluster])
    if (cluster, account, "") not in have_assocs:
        argvs.append(["add", "account", account, f"cluster={cluster}", "Description=slurm-aigc local"])
    argvs += [["add", "user", user, f"account={account}", f"cluster={cluster}"]
              for user in (*config.TEST_USERS, "root") if (cluster, account, user) not in have_assocs]
    return argvs


def must_stop_first(saved_shape: str | None, running: bool, wanted_shape: str, *, replace: bool) -> bool:
    """Whether `up` must first stop what the state directory holds in another shape.

    Stopping also forgets pid files of a shape's nodes that died (a reboot), so none linger.
    A running cluster of another shape is only replaced when asked to.
    """
    if saved_shape is None or saved_shape == wanted_shape:
        return False
    if running and not replace:
        raise ClusterError(f"a cluster of shape {saved_shape} is up; `slurm-aigc cluster down` first "
                           "(or `cluster up --replace`)")
    return True


def parse_shape_default() -> str:
    from slurm_aigc.localcluster.shape import DEFAULT_SHAPE
    return DEFAULT_SHAPE


def _make_char_device(path: Path, major: int, minor: int) -> None:
    if path.exists():
        if stat.S_ISCHR(path.stat().st_mode):
            return
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
