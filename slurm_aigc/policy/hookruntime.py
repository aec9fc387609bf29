"""Run the rendered job_submit.lua in lupa's Lua 5.1 with a `slurm` table like slurmctld's.

What `slurm-aigc classify` and the hook tests use: the very text slurmctld loads, called
the way job_submit/lua calls it (Slurm 22.05.8 `src/plugins/job_submit/lua/job_submit_lua.c`
and `src/lua/slurm_lua.c`): `job_desc` is an empty table whose metatable reads and writes a
hidden record; string fields take strings (numbers are converted), an empty string unsets
the field on submit; writes to unknown fields are logged and ignored; `slurm.log_*` format
with `string.format`; `slurm.user_msg` keeps only its last argument and joins calls with
newlines. Writing `job_desc.extra` raises here, because it crashes slurmctld 22.05.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lupa import lua51

from slurm_aigc.errors import AigcError
from slurm_aigc.policy.render import glob_matcher, lua_value

NO_VAL = 4294967294
INFINITE = 4294967295
NICE_OFFSET = 2147483648  # job_desc.nice = the user's nice + this (slurm.h)
SUCCESS = 0
ERROR = -1

STRING_FIELDS = (
    "account", "acctg_freq", "admin_comment", "alloc_node", "array_inx", "batch_features", "burst_buffer",
    "clusters", "comment", "container", "cpus_per_tres", "dependency", "exc_nodes", "features", "licenses",
    "mail_user", "mcs_label", "mem_per_tres", "name", "network", "partition", "prefer", "qos", "req_context",
    "req_nodes", "reservation", "script", "selinux_context", "std_err", "std_in", "std_out", "tres_bind",
    "tres_freq", "tres_per_job", "tres_per_node", "tres_per_socket", "tres_per_task", "wckey", "work_dir",
    "user_name", "extra",
)
NUMBER_FIELDS = (
    "argc", "begin_time", "bitflags", "boards_per_node", "contiguous", "core_spec", "cores_per_socket",
    "cpu_freq_min", "cpu_freq_max", "cpu_freq_gov", "cpus_per_task", "delay_boot", "end_time", "group_id", "het_job_offset",
    "immediate", "mail_type", "max_cpus", "max_nodes", "min_cpus", "min_mem_per_cpu", "min_mem_per_node",
    "min_nodes", "nice", "ntasks_per_board", "ntasks_per_core", "ntasks_per_gpu", "ntasks_per_node",
    "ntasks_per_socket", "ntasks_per_tres", "num_tasks", "pn_min_cpus", "pn_min_memory", "pn_min_tmp_disk",
    "priority", "reboot", "req_switch", "requeue", "shared", "site_factor", "sockets_per_board",
    "sockets_per_node", "threads_per_core", "time_limit", "time_min", "user_id", "wait4switch",
)
ESLURM_CODES = {
    "ESLURM_INVALID_PARTITION_NAME": 2000, "ESLURM_ACCESS_DENIED": 2002, "ESLURM_INVALID_NODE_COUNT": 2006,
    "ESLURM_INVALID_FEATURE": 2029, "ESLURM_INVALID_ACCOUNT": 2045, "ESLURM_INVALID_LICENSES": 2048,
    "ESLURM_ACCOUNTING_POLICY": 2050, "ESLURM_INVALID_TIME_LIMIT": 2051, "ESLURM_INVALID_QOS": 2066,
    "ESLURM_INVALID_GRES": 2072,
}

_SLURM_TABLE_LUA = r"""
local string_fields, number_fields, codes = ...
local events, user_msg = {}, nil
local S = {}
for _, f in ipairs(string_fields) do S[f] = true end
local N = {}
for _, f in ipairs(number_fields) do N[f] = true end

slurm = { SUCCESS = 0, ERROR = -1, FAILURE = -1, NO_VAL = 4294967294, NO_VAL16 = 65534, NO_VAL8 = 254,
  NO_VAL64 = 18446744073709551614, INFINITE = 4294967295, INFINITE16 = 65535, INFINITE64 = 18446744073709551615,
  MEM_PER_CPU = 9223372036854775808, NICE_OFFSET = 2147483648, ALLOC_SID_ADMIN_HOLD = 1, ALLOC_SID_USER_HOLD = 2,
  JOB_SHARED_NONE = 0, JOB_SHARED_OK = 1, JOB_SHARED_USER = 2, JOB_SHARED_MCS = 3 }
for name, value in pairs(codes) do slurm[name] = value end

-- C functions of slurm_lua.c / job_submit_lua.c.
slurm.log = function(level, msg) events[#events + 1] = { "log", level, msg } end
slurm.error = function(msg) events[#events + 1] = { "error", -1, msg } end
slurm.user_msg = function(...)
  local n = select("#", ...)
  local msg = n > 0 and select(n, ...) or nil
  if type(msg) == "number" then msg = tostring(msg) end
  if type(msg) ~= "string" then msg = "(null)" end
  events[#events + 1] = { "user", 0, msg }
  if user_msg then user_msg = user_msg .. "\n" .. msg else user_msg = msg end
end
slurm.time_str2mins = function(s) return tonumber(s) end
-- The Lua wrappers slurm_lua.c loads with luaL_loadstring.
slurm.log_error = function(...) slurm.error(string.format(unpack({...}))) end
slurm.log_info = function(...) slurm.log(0, string.format(unpack({...}))) end
slurm.log_verbose = function(...) slurm.log(1, string.format(unpack({...}))) end
slurm.log_debug = function(...) slurm.log(2, string.format(unpack({...}))) end
slurm.log_debug2 = function(...) slurm.log(3, string.format(unpack({...}))) end
slurm.log_debug3 = function(...) slurm.log(4, string.format(unpack({...}))) end
slurm.log_debug4 = function(...) slurm.log(5, string.format(unpack({...}))) end
slurm.log_user = function(...) slurm.user_msg(string.format(unpack({...}))) end

local function job_desc(store, is_modify)
  local t = {}
  setmetatable(t, {
    __index = function(_, k)
      local v = store[k]
      if v == nil and N[k] then return slurm.NO_VAL end
      return v
    end,
    __newindex = function(_, k, v)
      if k == "extra" then error("job_desc.extra written: this crashes slurmctld 22.05 (double free)", 2) end
      if S[k] then
        if type(v) ~= "string" and type(v) ~= "number" then
          error("bad argument #3 to '?' (string expected, got " .. type(v) .. ")", 2)
        end
        v = tostring(v)
        -- Every string setter of _set_job_req_field stores "" as NULL, which update_job reads
        -- as "no change" (22.05.8: a modify whose comment the hook cleaned to "" kept the old one).
        if v == "" then store[k] = nil else store[k] = v end
      elseif N[k] then
        local n = tonumber(v)
        if n == nil then error("bad argument #3 to '?' (number expected, got " .. type(v) .. ")", 2) end
        store[k] = n
      else
        events[#events + 1] = { "error", -1, "_set_job_field: unrecognized field: " .. tostring(k) }
      end
    end,
  })
  return t
end

local function record(store, hidden)
  return setmetatable({}, { __index = function(_, k) if hidden and hidden[k] then return nil end return store[k] end })
end
-- Fields a job record does not show job_submit/lua (_job_rec_field, 22.05 to 26.05), though a
-- job has them.
local JOB_RECORD_HIDDEN = { prefer = true }

local function partitions(parts)
  local list = {}
  for name, fields in pairs(parts) do list[name] = record(fields) end
  return list
end

local harness = {}

-- Seconds of Lua time per slurm_job_submit call, `n` calls on fresh copies of one job.
function harness.bench(desc_store, parts, uid, n)
  local lists = partitions(parts)
  local copies = {}
  for i = 1, n do
    local copy = {}
    for k, v in pairs(desc_store) do copy[k] = v end
    copies[i] = job_desc(copy, false)
  end
  local started = os.clock()
  for i = 1, n do
    events, user_msg = {}, nil
    slurm_job_submit(copies[i], lists, uid)
  end
  return (os.clock() - started) / n
end
function harness.call(kind, desc_store, rec_store, parts, uid)
  events, user_msg = {}, nil
  AIGC_LAST_CLASS = nil
  local rc
  if kind == "submit" then
    rc = slurm_job_submit(job_desc(desc_store, false), partitions(parts), uid)
  else
    rc = slurm_job_modify(job_desc(desc_store, true), record(rec_store, JOB_RECORD_HIDDEN), partitions(parts), uid)
  end
  return rc, AIGC_LAST_CLASS, events, user_msg
end
return harness
"""


class HookRuntimeError(AigcError):
    """The hook text could not be loaded or called in the Lua runtime."""


@dataclass(frozen=True)
class LogLine:
    kind: str  # log | error | user
    level: int
    text: str


@dataclass(frozen=True)
class HookResult:
    """One call of slurm_job_submit / slurm_job_modify, as slurmctld would see it."""

    rc: int
    job_class: str | None
    before: Mapping[str, Any]
    after: Mapping[str, Any]
    user_msg: str | None
    log: tuple[LogLine, ...]

    @property
    def accepted(self) -> bool:
        return self.rc == SUCCESS

    @property
    def changes(self) -> dict[str, tuple[Any, Any]]:
        """Fields whose value changed: field -> (before, after), None for unset."""
        keys = sorted(set(self.before) | set(self.after))
        return {k: (self.before.get(k), self.after.get(k)) for k in keys if self.before.get(k) != self.after.get(k)}

    @property
    def messages(self) -> list[str]:
        return [line.text for line in self.log if line.kind == "user"]

    def logged(self, kind: str = "log") -> list[str]:
        return [line.text for line in self.log if line.kind == kind]


def _to_lua(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogateescape")
    return value


def _from_lua(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class HookRuntime:
    """A Lua 5.1 state holding one rendered job_submit.lua, loaded the way slurmctld loads it."""

    def __init__(self, hook_text: str) -> None:
        self._lua = lua51.LuaRuntime(encoding=None, unpack_returned_tuples=True, register_eval=False)
        table = self._lua.table_from
        loader = self._lua.eval(b"function(setup_text, s, n, c, e) return loadstring(setup_text)(s, n, c, e) end")
        self._harness = loader(
            _SLURM_TABLE_LUA.encode(),
            table([f.encode() for f in STRING_FIELDS]), table([f.encode() for f in NUMBER_FIELDS]),
            table({k.encode(): v for k, v in ESLURM_CODES.items()}),
        )
        load = self._lua.eval(b"function(text) local chunk, err = loadstring(text, '=job_submit.lua') "
                              b"if not chunk then return nil, err end return pcall(chunk) end")
        ok, rc = load(hook_text.encode("utf-8", "surrogateescape"))
        if ok is None or ok is False:
            raise HookRuntimeError(f"job_submit.lua does not load: {_from_lua(rc)}")
        if rc != SUCCESS:
            raise HookRuntimeError(f"job_submit.lua returned {rc!r} on load (slurmctld wants slurm.SUCCESS)")

    def submit(self, fields: Mapping[str, Any], *, submit_uid: int, partitions: Mapping[str, Mapping[str, Any]] | None = None) -> HookResult:
        """slurm_job_submit(job_desc, part_list, submit_uid)."""
        return self._call("submit", fields, {}, submit_uid, partitions)

    def modify(self, fields: Mapping[str, Any], record: Mapping[str, Any], *, modify_uid: int,
               partitions: Mapping[str, Mapping[str, Any]] | None = None) -> HookResult:
        """slurm_job_modify(job_desc, job_rec, part_list, modify_uid) (`scontrol update job`)."""
        return self._call("modify", fields, record, modify_uid, partitions)

    def _call(self, kind: str, fields: Mapping[str, Any], record: Mapping[str, Any], uid: int,
              partitions: Mapping[str, Mapping[str, Any]] | None) -> HookResult:
        parts = partitions if partitions is not None else default_partitions()
        store = self._table(fields)
        lua_parts = self._lua.table_from({_to_lua(name): self._table(p) for name, p in parts.items()})
        try:
            rc, job_class, events, user_msg = self._harness.call(kind.encode(), store, self._table(record), lua_parts, uid)
        except lua51.LuaError as error:
            # slurmctld would log this and (22.05.8) accept the job, (others) reject it.
            raise HookRuntimeError(f"error escaped the hook: {_from_lua(error.args[0]) if error.args else error}") from error
        after = {_from_lua(k): _from_lua(v) for k, v in store.items()}
        log = tuple(LogLine(_from_lua(e[1]), int(e[2]), _from_lua(e[3])) for e in events.values())
        return HookResult(
            rc=int(rc) if isinstance(rc, (int, float)) else SUCCESS,
            job_class=_from_lua(job_class), before=dict(_clean(fields)), after=after,
            user_msg=_from_lua(user_msg), log=log,
        )

    def seconds_per_submit(self, fields: Mapping[str, Any], *, submit_uid: int, calls: int = 10_000) -> float:
        """Lua CPU time of one slurm_job_submit call (benchmarks/bench_hook.py)."""
        parts = self._lua.table_from({_to_lua(n): self._table(p) for n, p in default_partitions().items()})
        return float(self._harness.bench(self._table(fields), parts, submit_uid, calls))

    def parse_tags(self, comment: str) -> tuple[dict[str, Any], list[str]]:
        """The hook's own `parse_tags(comment)`: (accepted tags, the text of each bad pair)."""
        returned = self._pure(b"parse_tags")(_to_lua(comment))
        tags, problems = returned if isinstance(returned, tuple) else (returned, None)
        accepted = {_from_lua(k): _from_lua(v) for k, v in tags.items()} if tags is not None else {}
        bad = [_from_lua(p[b"text"]) for p in problems.values()] if problems is not None else []
        return accepted, bad

    def stamp_of(self, admin_comment: str) -> tuple[dict[str, str], str, str]:
        """The hook's reading of an AdminComment: (stamp tags, stamp text, the rest)."""
        found, text, rest = self._pure(b"stamp_of")(_to_lua(admin_comment))
        return {_from_lua(k): _from_lua(v) for k, v in found.items()}, _from_lua(text), _from_lua(rest)

    def glob_matches(self, glob: str, name: str) -> bool:
        """The hook's name-glob test, `glob` compiled as `policy render` compiles it."""
        compiled = self._lua.eval(lua_value(glob_matcher(glob)).encode("utf-8"))
        return bool(self._pure(b"glob_matches")(compiled, _to_lua(name)))

    def shard_request(self, job_class: str, vram_gib: float, learned: Mapping[str, Any] | None = None
                      ) -> tuple[int | None, list[str], float | None]:
        """The hook's shard request for a one-GPU job: (shards or None, GPU types kept, expected SM)."""
        table = self._table(learned) if learned is not None else None
        shards, kept, sm, _source = self._pure(b"shard_request")(_to_lua(job_class), vram_gib, table)
        names = [_from_lua(t[b"name"]) for t in kept.values()] if kept is not None else []
        return (int(shards) if shards is not None else None), names, sm

    def learned_key(self, name: str) -> str:
        """The hook's learned-table key of a job name (`learned_key`; telemetry/learned.py `name_pattern`)."""
        return str(_from_lua(self._pure(b"learned_key")(_to_lua(name))))

    def _pure(self, name: bytes) -> Any:
        return self._lua.globals()[b"AIGC_PURE"][name]

    def _table(self, fields: Mapping[str, Any]) -> Any:
        return self._lua.table_from({_to_lua(k): _to_lua(v) for k, v in _clean(fields).items()})


def _clean(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Drop unset values (None); Slurm shows those to Lua as nil (strings) or NO_VAL (numbers)."""
    return {k: v for k, v in fields.items() if v is not None}


def default_partitions() -> dict[str, dict[str, Any]]:
    """The local cluster's one partition (`PartitionName=gpu Default=YES MaxTime=INFINITE`)."""
    return {"gpu": {"name": "gpu", "max_time": INFINITE, "default_time": NO_VAL, "flag_default": 1}}
