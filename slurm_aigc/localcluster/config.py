"""Renders the local cluster's Slurm configuration files (pure functions of shape and layout)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurm_aigc.localcluster.shape import ClusterShape, NodeSpec
from slurm_aigc.shipped import JOB_RECORD, shipped_file

CLUSTER_NAME = "aigc"
ACCOUNT = "aigc"
TEST_USERS = ("aigc-alice", "aigc-bob")


@dataclass(frozen=True)
class Layout:
    """Where the cluster's files live; everything under one state directory."""

    state_dir: Path
    hostname: str
    slurm_version: tuple[int, int, int]
    ctld_port: int = 6817
    dbd_port: int = 6819
    mysql_port: int = 6833

    @property
    def etc(self) -> Path:
        return self.state_dir / "etc"

    @property
    def log(self) -> Path:
        return self.state_dir / "log"

    @property
    def run(self) -> Path:
        return self.state_dir / "run"

    @property
    def spool(self) -> Path:
        return self.state_dir / "spool"

    @property
    def dev(self) -> Path:
        return self.state_dir / "dev"

    @property
    def mysql_data(self) -> Path:
        return self.state_dir / "mysql"

    @property
    def slurm_conf(self) -> Path:
        return self.etc / "slurm.conf"

    def gpu_device(self, node: str, index: int) -> Path:
        return self.dev / node / f"nvidia{index}"


def render_slurm_conf(shape: ClusterShape, layout: Layout) -> str:
    """slurm.conf for a cons_tres GPU cluster whose nodes are `slurmd -N NAME` on loopback."""
    gpu_tres = ",".join(f"gres/gpu:{model.gres_type}" for model in shape.gpu_types)
    lines = [
        "# Written by slurm-aigc cluster up; regenerated on every `up`.",
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={layout.hostname}(127.0.0.1)",
        f"SlurmctldPort={layout.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # A requeued job can start again only once its old credential expired (default 120 s).
        "AuthInfo=cred_expire=10",
        f"StateSaveLocation={layout.spool}/ctld",
        f"SlurmdSpoolDir={layout.spool}/slurmd-%n",
        f"SlurmctldPidFile={layout.run}/slurmctld.pid",
        f"SlurmdPidFile={layout.run}/slurmd-%n.pid",
        f"SlurmctldLogFile={layout.log}/slurmctld.log",
        f"SlurmdLogFile={layout.log}/slurmd-%n.log",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # No cgroups inside this sandbox: Debian 12's slurmd runs with these (measured).
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "MpiDefault=none",
        "SwitchType=switch/none" if layout.slurm_version < (23, 11, 0) else "",
        "SchedulerType=sched/backfill",
        # Slurm's main scheduler stops at the first job of a partition that cannot start, so small
        # jobs behind a pending 8-GPU job wait for backfill. Replays compress time 60x: a real
        # cluster's 30 s cycle against hour-long jobs is under 1 s here, and 1 s is Slurm's
        # shortest. At 10 s, GPUs sat free for seconds after each job in both runs, which cost
        # stock Slurm more than slurm-aigc (docs/benchmarks.md, "Backfill every second").
        "SchedulerParameters=bf_interval=1",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU",
        "GresTypes=gpu,shard",
        "JobSubmitPlugins=lua",
        "JobRequeue=1",
        "ReturnToService=2",
        "MinJobAge=600",
        "KillWait=5",
        "InactiveLimit=0",
        "SlurmdParameters=config_overrides",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={layout.dbd_port}",
        "AccountingStorageEnforce=associations,limits,qos",
        f"AccountingStorageTRES=gres/gpu,{gpu_tres},gres/shard",
        "AccountingStoreFlags=job_comment",
        "JobCompType=jobcomp/none",
        # The agent learns each job's GPUs from these records, not from slurmctld (docs/telemetry.md).
        f"Prolog={shipped_file(JOB_RECORD)}",
        f"Epilog={shipped_file(JOB_RECORD)}",
        "PrologFlags=Alloc",
        "",
    ]
    lines += [render_node_line(node, layout) for node in shape.nodes]
    lines += ["PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]
    return "\n".join(line for line in lines if line is not None) + "\n"


def render_node_line(node: NodeSpec, layout: Layout) -> str:
    gres = f"gpu:{node.gpu.gres_type}:{node.gpu_count},shard:{node.gpu_count * node.shards_per_gpu}"
    return (
        f"NodeName={node.name} NodeHostname={layout.hostname} NodeAddr=127.0.0.1 Port={node.port} "
        f"CPUs={node.cpus} RealMemory=64000 Gres={gres} Features={node.gpu.gres_type} State=UNKNOWN"
    )


def render_gres_conf(shape: ClusterShape, layout: Layout) -> str:
    """gres.conf: no autodetection; every GPU names a placeholder device so 22.05 keeps it."""
    lines = ["# Written by slurm-aigc cluster up.", "AutoDetect=off"]
    for node in shape.nodes:
        for index in range(node.gpu_count):
            device = layout.gpu_device(node.name, index)
            lines.append(f"NodeName={node.name} Name=gpu Type={node.gpu.gres_type} File={device}")
        for index in range(node.gpu_count):
            device = layout.gpu_device(node.name, index)
            lines.append(f"NodeName={node.name} Name=shard Count={node.shards_per_gpu} File={device}")
    return "\n".join(lines) + "\n"


def render_slurmdbd_conf(layout: Layout, db_password: str) -> str:
    return "\n".join([
        "# Written by slurm-aigc cluster up.",
        "AuthType=auth/munge",
        "DbdHost=localhost",
        "DbdAddr=127.0.0.1",
        f"DbdPort={layout.dbd_port}",
        "SlurmUser=root",
        "DebugLevel=info",
        f"LogFile={layout.log}/slurmdbd.log",
        f"PidFile={layout.run}/slurmdbd.pid",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={layout.mysql_port}",
        "StorageUser=slurm",
        f"StoragePass={db_password}",
        "StorageLoc=slurm_acct_db",
        "",
    ])


# slurm-aigc's own database on the cluster's MariaDB, and its roles (docs/deploy.md has the
# same grants for a site). The controller owns the schema; an agent may only add samples.
AIGC_DATABASE = "slurm_aigc"
TEST_DATABASE_PREFIX = "slurm_aigc_test_"
SCRATCH_DATABASE_PREFIX = "slurm_aigc_scratch_"  # a replay's or an integration test's own database
DB_ROLES = ("controller", "agent", "test")
DB_USERS = {"controller": "aigc_controller", "agent": "aigc_agent", "test": "aigc_test"}
AGENT_INSERT_TABLES = ("gpu_samples", "process_samples", "job_gpu_samples")
AGENT_SELECT_TABLES = ("schema_version",)


def aigc_db_url(layout: Layout, role: str, password: str, database: str = AIGC_DATABASE) -> str:
    """The SQLAlchemy URL a role uses (PyMySQL over TCP on loopback)."""
    return (f"mysql+pymysql://{DB_USERS[role]}:{password}@127.0.0.1:{layout.mysql_port}/{database}"
            "?charset=utf8mb4")


def render_aigc_users_sql(passwords: dict[str, str]) -> str:
    """Users and the grants that need no tables: idempotent, re-run on every `up`.

    Passwords are hex (`secrets.token_hex`), so quoting them in SQL is safe.
    """
    statements = [f"CREATE DATABASE IF NOT EXISTS {AIGC_DATABASE} CHARACTER SET utf8mb4"]
    for role in DB_ROLES:
        user = f"'{DB_USERS[role]}'@'127.0.0.1'"
        statements += [f"CREATE USER IF NOT EXISTS {user} IDENTIFIED BY '{passwords[role]}'",
                       f"ALTER USER {user} IDENTIFIED BY '{passwords[role]}'"]
    statements += [
        f"GRANT ALL PRIVILEGES ON {AIGC_DATABASE}.* TO '{DB_USERS['controller']}'@'127.0.0.1'",
    ]
    # Test sessions, replays and integration tests create and drop databases of their own.
    statements += [f"GRANT ALL PRIVILEGES ON `{prefix.replace('_', chr(92) + '_')}%`.* TO '{DB_USERS['test']}'@'127.0.0.1'"
                   for prefix in (TEST_DATABASE_PREFIX, SCRATCH_DATABASE_PREFIX)]
    return ";\n".join(statements) + ";\n"


def render_agent_grants_sql(database: str = AIGC_DATABASE, user: str = "'aigc_agent'@'127.0.0.1'") -> str:
    """The agent role's grants (the tables must exist): insert samples, read the schema version."""
    statements = [f"GRANT INSERT ON {database}.{table} TO {user}" for table in AGENT_INSERT_TABLES]
    statements += [f"GRANT SELECT ON {database}.{table} TO {user}" for table in AGENT_SELECT_TABLES]
    return ";\n".join(statements) + ";\n"


def render_cgroup_conf(layout: Layout) -> str:
    # Slurm >= 24.05 probes cgroups in slurmd even with proctrack/linuxproc unless told not to.
    plugin = "CgroupPlugin=disabled" if layout.slurm_version >= (24, 5, 0) else "CgroupAutomount=no"
    return f"# Written by slurm-aigc cluster up.\n{plugin}\n"


NOOP_HOOK_LUA = """-- slurm-aigc placeholder: accepts every job unchanged until `slurm-aigc policy install`.
function slurm_job_submit(job_desc, part_list, submit_uid)
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return slurm.SUCCESS
end

return slurm.SUCCESS
"""
