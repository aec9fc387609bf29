-- aigc_hook.lua: the rules of the slurm-aigc job_submit hook, as pure local functions.
--
-- `slurm-aigc policy install` renders ONE self-contained job_submit.lua:
--     local AIGC_POLICY = { ...rendered from etc/slurm-aigc.yaml... }
--     local AIGC_HOOK = (function(...) <this file> end)(AIGC_POLICY)
--     <job_submit.lua: the thin slurm_job_submit / slurm_job_modify entry>
-- so slurmctld needs no package.path and `slurm-aigc classify` runs the very same text in lupa.
--
-- Written for Lua 5.1 (Debian's slurmctld links liblua5.1). Everything that does not depend on
-- the job is computed once, when slurmctld loads the file; the per-job path reads a handful of
-- job_desc fields and builds strings only when it rewrites something.

local P = ...
local slurm = slurm

local find, sub, match, gmatch, gsub, lower, upper, format, byte = string.find, string.sub, string.match,
    string.gmatch, string.gsub, string.lower, string.upper, string.format, string.byte
local ceil, floor, max, tostring, tonumber, type, ipairs = math.ceil, math.floor, math.max, tostring, tonumber, type,
    ipairs

local NO_VAL = 4294967294
local INFINITE = 4294967295
local NICE_OFFSET = 2147483648  -- job_desc.nice holds the user's nice + this (slurm.h NICE_OFFSET)
local TAG_PREFIX = "aigc:"
local JOB_PENDING = 0
local JOB_STATE_FLAGS_AT = 256  -- JOB_STATE_BASE is the low byte of job_state (slurm.h)
local MAX_FEATURE_LEN = 64  -- as slurm_aigc/telemetry/features.py publishes them
-- The most of any user string the hook reads (bytes): the work per job stays bounded whatever
-- a user sends (slurmctld checks its own limits only after the plugin ran). slurm_aigc/tags.py
-- reads comments with the same cap.
local MAX_NAME_READ = 1024     -- Slurm's own limits (_test_job_desc_fields, 22.05 to 26.05)
local MAX_COMMENT_READ = 1024
-- The trusted stamp opening the AdminComment (slurm_aigc/tags.py): only slurmctld and admins
-- can write that field, so the daemons believe it and never the user's comment.
local STAMP_CLASS, STAMP_RECLAIM, STAMP_SIGNAL = "aigc_class=", "aigc_reclaim=", "aigc_signal="
-- `aigc_learned=1`: the hook filled keys the tag left out from the learned table (learned_defaults).
local STAMP_LEARNED = "aigc_learned="
-- `aigc_share=no`: the user's `share=no`, kept where the owner cannot change it later, because
-- on Slurm 22.05 the controller requeues a shard job Slurm put on such a job's GPU by mistake
-- (slurm_aigc/reclaim/gpuconflict.py): a later comment edit must not aim that at a neighbour.
local STAMP_SHARE = "aigc_share="

local M = {}

-- ---------------------------------------------------------------------------------------------
-- Precomputed policy views (load time).

local CLASS_SET = {}
for name, _ in pairs(P.classes) do CLASS_SET[name] = true end

local UNTOUCHED = {}
for _, name in ipairs(P.hook.untouched_classes) do UNTOUCHED[name] = true end

-- GPU types sorted by memory, ascending (the renderer already sorts; keep a local array).
local TYPES = P.inventory.gpu_types
local DEBUG = P.hook.debug_log
local STRICT = P.hook.strict_tags
local SHARD_GRES = P.inventory.shard_gres

local function set_of(list)
    local set = {}
    for _, item in ipairs(list) do set[item] = true end
    return set
end

local function set_of_names(records)
    local set = {}
    for _, record in ipairs(records) do set[record.name] = true end
    return set
end

local SHARD_CLASSES = set_of(P.rewrites.shard.classes)
local NVLINK_CLASSES = set_of(P.rewrites.nvlink.classes)

-- Detection needs the GPU count only when some rule looks at it.
local DETECTION_NEEDS_GPUS = false
for _, rule in ipairs(P.detection) do
    if rule.min_gpus or rule.max_gpus then DETECTION_NEEDS_GPUS = true end
end

-- Signals a job may declare it handles (`aigc:signal=B.USR1`): those the reclaim `signal` rung
-- may send while cancelling is off (slurm_aigc/tags.py SIGNAL_NAMES, rendered).
local SIGNAL_SET = set_of(P.signal_names)
local SIGNAL_LIST_TEXT = table.concat(P.signal_names, ", ")

local BOOLEANS = { yes = true, ["true"] = true, ["1"] = true, on = true, no = false, ["false"] = false, ["0"] = false, off = false }
local UNIT_GIB = { k = 1 / 1048576, m = 1 / 1024, g = 1, t = 1024 }

local GRES_FIELDS = { "tres_per_node", "tres_per_job", "tres_per_socket", "tres_per_task" }

-- ---------------------------------------------------------------------------------------------
-- Tags: `aigc:key=value,key=value` anywhere in the comment.

local function parse_vram_gib(text)
    local number, unit = match(text, "^(%d+%.?%d*)%s*([KkMmGgTt])[iI]?[bB]?$")
    if not number then return nil end
    local gib = tonumber(number) * UNIT_GIB[lower(unit)]
    if gib <= 0 then return nil end
    return gib
end

-- `aigc:signal=`: `[B: or B.][SIG]NAME`, ASCII case-insensitive -> `USR1` (job steps) or
-- `B.USR1` (batch shell, as `--signal=B:USR1`; a stamp value writes `.` for `:`). Numbers are
-- refused: they differ between systems. Same reading as slurm_aigc/tags.py `signal_tag`.
local function parse_signal(value)
    local text = upper(value)
    local batch = sub(text, 1, 2)
    if batch == "B:" or batch == "B." then text = sub(text, 3) else batch = nil end
    if sub(text, 1, 3) == "SIG" then text = sub(text, 4) end
    if not SIGNAL_SET[text] then return nil end
    return (batch and "B." or "") .. text
end

-- One problem per bad pair: {text = "vram=lots", why = "...", fix = "..."}.
local function check_pair(key, value)
    if value == "" then return nil, "empty value", "give a value or drop the key" end
    if key == "type" then
        local class = lower(value)
        if CLASS_SET[class] then return class end
        return nil, "unknown class", "use one of " .. P.class_list_text
    elseif key == "model" then
        -- Same cleaning as the publisher's model_feature(): unsafe runs -> "_", outer "_" dropped.
        local model = gsub(gsub(gsub(value, "[^%w_%.%-]+", "_"), "^_+", ""), "_+$", "")
        if model ~= "" then return model end
        return nil, "no usable characters", "use letters, digits, _ . - in model ids"
    elseif key == "vram" then
        local gib = parse_vram_gib(value)
        if gib then return gib end
        return nil, "not a size", "give a per-GPU size with a unit, e.g. vram=20G"
    elseif key == "share" or key == "nvlink" or key == "reclaim" then
        local flag = BOOLEANS[lower(value)]
        if flag ~= nil then return flag end
        return nil, "not yes/no", "use " .. key .. "=yes or " .. key .. "=no"
    elseif key == "signal" then
        local signal = parse_signal(value)
        if signal then return signal end
        return nil, "not a signal a job can declare it handles",
            "use one of " .. SIGNAL_LIST_TEXT .. ", e.g. signal=USR1 (job steps) or signal=B.USR1 (batch shell)"
    end
    return nil, "unknown key", "known keys: type, model, vram, share, nvlink, reclaim, signal"
end

-- The grammar (docs/tags.md; slurm_aigc/tags.py mirrors it, a property test holds them equal):
-- only the first `aigc:` within the first MAX_COMMENT_READ bytes is read, up to the next
-- whitespace; pairs are split on `,`, empty ones skipped; a pair is key=value.
-- Returns (tags or nil, problems or nil).
local function parse_tags(comment)
    if type(comment) ~= "string" then return nil end
    comment = sub(comment, 1, MAX_COMMENT_READ)
    local at = find(comment, TAG_PREFIX, 1, true)
    if not at then return nil end
    local body = match(comment, "^%S*", at + #TAG_PREFIX)
    local tags, problems = {}, nil
    for pair in gmatch(body, "[^,]+") do
        local key, value = match(pair, "^([%a_][%w_]*)=(.*)$")
        local parsed, why, fix
        if not key then
            why, fix = "not key=value", "write pairs as key=value separated by commas"
        elseif tags[key] ~= nil then
            why, fix = "repeated key", "give " .. key .. " once"
        else
            parsed, why, fix = check_pair(key, value)
        end
        if parsed ~= nil then
            tags[key] = parsed
        else
            problems = problems or {}
            problems[#problems + 1] = { text = pair, why = why, fix = fix }
        end
    end
    return tags, problems
end
M.parse_tags = parse_tags

-- The stamp words opening an AdminComment (`aigc_class=train aigc_reclaim=no; ...`): the run
-- of `aigc_<key>=<value>` words before the first `;`. Returns {key = value} (first wins) and
-- the stamp text as it stands. Same rule as slurm_aigc/tags.py `trusted_tags`.
-- Also returns the text after the stamp (leading blanks and `;` dropped).
local function stamp_of(admin_comment)
    local found, words, pos = {}, {}, 1
    if type(admin_comment) ~= "string" then return found, "", "" end
    while true do
        local _, last, word = find(admin_comment, "^%s*([^%s;]+)", pos)
        if not word then break end
        local key, value = match(word, "^aigc_(%l+)=([%w_%.:%-]+)$")
        if not key then break end
        if found[key] == nil then found[key] = value end
        words[#words + 1] = word
        pos = last + 1
    end
    return found, table.concat(words, " "), match(admin_comment, "^[%s;]*(.*)$", pos)
end
M.stamp_of = stamp_of

-- The comment without any stamp-like word a user wrote (`aigc_class=interactive`): such
-- words mean nothing in a comment, and must not mislead a reader that still looks there.
local function without_stamp_words(comment)
    if not find(comment, "aigc_", 1, true) then return comment end
    -- Each match takes the whitespace before it; the added space stands in for a first word.
    return sub(gsub(" " .. comment, "%saigc_%a+=%S*", ""), 2)
end

-- ---------------------------------------------------------------------------------------------
-- The job as the rules see it.

local function job_view(job_desc, job_rec, part_list, uid, is_modify)
    return { desc = job_desc, rec = job_rec, parts = part_list, uid = uid, modify = is_modify, plan = {}, planned = {} }
end

-- A field of the job: on modify, the updated value, else the job record's. An update leaves
-- the numbers it does not change at NO_VAL (not nil): those are read from the record too.
local function get(view, field)
    local value = view.desc[field]
    if view.rec and (value == nil or value == NO_VAL) then
        local recorded = view.rec[field]
        if recorded == nil and field == "tres_per_node" then recorded = view.rec.gres end
        if recorded ~= nil then value = recorded end
    end
    return value
end

local function push(view, list_name, item)
    local list = view[list_name]
    if not list then
        list = {}
        view[list_name] = list
    end
    list[#list + 1] = item
end

-- slurmctld.log gets a user's name, comment and GRES as written; a newline in them would forge
-- log lines. Control bytes (and `\`, so an escape cannot be faked) become `\n`, `\x1b`, ...
local LOG_ESCAPES = { ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t", ["\\"] = "\\\\" }
local LOG_UNSAFE = "[\1-\31\127\\]"  -- no NUL: a C string from slurmctld cannot hold one

local function log_escape(char)
    return LOG_ESCAPES[char] or format("\\x%02x", byte(char))
end

local function log_text(text)
    if not find(text, LOG_UNSAFE) then return text end
    return (gsub(text, LOG_UNSAFE, log_escape))
end

M.log_text = log_text  -- job_submit.lua escapes its error line with it too

-- slurm.log_info / log_debug with the whole line escaped: the one way the hook logs.
local function log_info(fmt, ...) slurm.log_info("%s", log_text(format(fmt, ...))) end
local function log_debug(fmt, ...) slurm.log_debug("%s", log_text(format(fmt, ...))) end

-- ---------------------------------------------------------------------------------------------
-- GPU requests: "gres:gpu:2" (22.05), "gres/gpu:a100:2" (23.02+), "gpu:1", "gres/gpu=2".

-- Returns a table describing the gpu entry of one tres_per_* string, or nil.
local function parse_gpu_entry(entry)
    local prefix, rest = match(entry, "^(gres[:/])(.*)$")
    if not prefix then prefix, rest = "", entry end
    local name, tail = match(rest, "^([%w_]+)(.*)$")
    if name ~= "gpu" then return nil end
    local gpu_type, sep, count = match(tail, "^:([%w_%-%.]+)([:=])(%d+)$")
    if not gpu_type then
        sep, count = match(tail, "^([:=])(%d+)$")
        if not sep then
            gpu_type = match(tail, "^:([%w_%-%.]+)$")
            if not gpu_type and tail ~= "" then return false end
            sep, count = ":", "1"
        end
    end
    return { prefix = prefix, type = gpu_type, sep = sep, count = tonumber(count) }
end

-- Every entry of the job's GRES fields, in field order: {field, value, index (in its field), entry}.
local function gres_entries(view)
    local entries = {}
    for _, field in ipairs(GRES_FIELDS) do
        local value = get(view, field)
        if type(value) == "string" then
            local index = 0
            for entry in gmatch(value, "[^,]+") do
                index = index + 1
                entries[#entries + 1] = { field = field, value = value, index = index, entry = entry }
            end
        end
    end
    return entries
end

-- Does any GRES field ask for a GPU or for shards of one (whatever the syntax)?
local function asks_gpu(view)
    for _, e in ipairs(gres_entries(view)) do
        local name = match(e.entry, "^gres[:/]([%w_]+)") or match(e.entry, "^([%w_]+)")
        if name == "gpu" or name == SHARD_GRES then return true end
    end
    return false
end

-- Finds the one field holding a GPU request. Returns (gpu or nil, ambiguous).
local function find_gpu(view)
    local found
    for _, e in ipairs(gres_entries(view)) do
        local gpu = parse_gpu_entry(e.entry)
        if gpu == false then return nil, true end
        if gpu then
            if found then return nil, true end
            gpu.field, gpu.value, gpu.index = e.field, e.value, e.index
            found = gpu
        end
    end
    return found, false
end

-- Rebuilds a tres string with entry `index` replaced (nil drops it).
local function replace_entry(value, index, new_entry)
    local out, i = {}, 0
    for entry in gmatch(value, "[^,]+") do
        i = i + 1
        if i == index then
            if new_entry then out[#out + 1] = new_entry end
        else
            out[#out + 1] = entry
        end
    end
    return table.concat(out, ",")
end

-- ---------------------------------------------------------------------------------------------
-- Feature expressions: our additions are AND-ed to the user's --constraint, which we combine
-- with only when it is a plain AND list (anything fancier is left alone, and so is the job).

local function simple_features(existing)
    return existing == nil or existing == "" or match(existing, "^[%w_%.%-&]+$") ~= nil
end

local function has_word(expr, word)
    for part in gmatch(expr, "[^&]+") do
        if part == word then return true end
    end
    return false
end

-- Feature expression allowing exactly the GPU types in `allowed` (array of type records).
local function types_expr(allowed)
    local features = {}
    for _, t in ipairs(allowed) do
        if not t.feature then return nil end
        features[#features + 1] = t.feature
    end
    if #features == 1 then return features[1] end
    return "(" .. table.concat(features, "|") .. ")"
end

-- ---------------------------------------------------------------------------------------------
-- The job view and the plan of changes.

-- The value a field will have after the planned changes.
local function current(view, field)
    local planned = view.planned[field]
    if planned ~= nil then return planned end
    return get(view, field)
end

-- `quiet` changes (the stamp) are not told to the user and logged only with hook.debug_log.
local function plan(view, field, value, why, quiet)
    local before = current(view, field)
    if before == value then return end
    local plan_list = view.plan
    plan_list[#plan_list + 1] = { field = field, value = value, before = get(view, field), why = why, quiet = quiet }
    view.planned[field] = value
end

local function note_user(view, text)
    push(view, "notes", text)
end

-- ---------------------------------------------------------------------------------------------
-- Classification.

-- A component after the first of a heterogeneous job: `het_job_offset` 1.. (slurmctld sets it
-- before job_submit on every version 22.05 to 26.05; NO_VAL outside a hetjob, 0 on the leader).
local function het_component(view)
    local offset = view.desc.het_job_offset
    return type(offset) == "number" and offset ~= 0 and offset ~= NO_VAL
end

-- `interactive` means no batch script (srun/salloc); the script is read only when a rule asks.
-- Only an sbatch hetjob's leader carries the script (sbatch.c), so its later components arrive
-- without one, exactly like the components of `salloc ... : ...`, and no job_desc field tells
-- the two apart (the RPC type is not shown to the plugin). Such a component is therefore never
-- interactive: granting it would exempt batch GPU work from reclaim. The cost falls on salloc/
-- srun hetjobs, whose later components are classed by the other rules (docs/hook.md).
local function is_interactive(view)
    if view.interactive == nil then
        view.interactive = (not view.modify) and get(view, "script") == nil and not het_component(view)
    end
    return view.interactive
end

-- Name globs arrive precompiled (render.py `glob_matcher`) as segments between the `*`s: a
-- plain string, or (with `?`) a Lua pattern of single characters with no quantifier. Each
-- segment is found at its leftmost place after the previous one, which is exact for `*`
-- globs and never backtracks: at most (name length x glob length) byte comparisons.
local function segment_at(name, seg, pos)
    if seg.plain then return sub(name, pos, pos + seg.len - 1) == seg.text end
    return find(name, seg.anchored, pos) == pos
end

local function segment_find(name, seg, init)
    if seg.plain then return find(name, seg.text, init, true) end
    return find(name, seg.pattern, init)
end

local function glob_matches(glob, name)
    local n = #name
    if glob.exact then return n == glob.exact.len and segment_at(name, glob.exact, 1) end
    local pos = 1
    if glob.head then
        if not segment_at(name, glob.head, 1) then return false end
        pos = 1 + glob.head.len
    end
    for _, seg in ipairs(glob.middle) do
        local start = segment_find(name, seg, pos)
        if not start then return false end
        pos = start + seg.len
    end
    if glob.tail then
        local start = n - glob.tail.len + 1
        return start >= pos and segment_at(name, glob.tail, start)
    end
    return true
end
M.glob_matches = glob_matches

-- `lname` is the lower-cased job name, at most MAX_NAME_READ bytes (or nil).
local function matches_name(rule, lname)
    if not lname then return false end
    for _, glob in ipairs(rule.globs) do
        if glob_matches(glob, lname) then return true end
    end
    return false
end

local function matches_rule(rule, view, lname)
    if rule.interactive ~= nil and rule.interactive ~= is_interactive(view) then return false end
    if rule.min_gpus or rule.max_gpus then
        local gpus = view.gpu and view.gpu.count or 0
        if rule.min_gpus and gpus < rule.min_gpus then return false end
        if rule.max_gpus and gpus > rule.max_gpus then return false end
    end
    if rule.globs then return matches_name(rule, lname) end
    return true
end

local function detect_class(view)
    local name = get(view, "name")
    local lname = type(name) == "string" and lower(sub(name, 1, MAX_NAME_READ)) or nil
    for _, rule in ipairs(P.detection) do
        if matches_rule(rule, view, lname) then return rule.class end
    end
    return "unknown"
end

-- ---------------------------------------------------------------------------------------------
-- Rules: one ordered list, one signature `rule(view)`; each reads `view` and calls `plan`.

local function single_node(view)
    local min_nodes = get(view, "min_nodes")
    local max_nodes = get(view, "max_nodes")
    return (min_nodes == nil or min_nodes == NO_VAL or min_nodes <= 1)
        and (max_nodes == nil or max_nodes == NO_VAL or max_nodes == 0 or max_nodes <= 1)
end

-- GPUs one node gets, when the request says so plainly.
local function gpus_per_node(view)
    local gpu = view.gpu
    if not gpu then return nil end
    if gpu.field == "tres_per_node" then return gpu.count end
    if gpu.field == "tres_per_job" and single_node(view) then return gpu.count end
    return nil
end

local function type_by_name(name)
    for _, t in ipairs(TYPES) do
        if t.name == name then return t end
    end
    return nil
end

-- Keep the job on `allowed` GPU types (intersected with earlier restrictions); the feature
-- expression itself is written once, by rule_features. Returns false when it cannot be done.
local function restrict_types(view, allowed, why)
    local before = view.allowed
    local kept = {}
    for _, t in ipairs(allowed) do
        if before == nil or before[t.name] then kept[#kept + 1] = t end
    end
    if #kept == 0 then
        note_user(view, "aigc: " .. why .. " conflicts with an earlier rule; left unchanged")
        return false
    end
    if #kept == #TYPES then return true end
    if not types_expr(kept) or not simple_features(get(view, "features")) then
        note_user(view, "aigc: cannot add a GPU type constraint for " .. why .. " to your --constraint; left unchanged")
        return false
    end
    view.allowed = set_of_names(kept)
    view.allowed_list = kept
    push(view, "feature_why", why)
    return true
end

local function add_feature(view, feature, why)
    if not simple_features(get(view, "features")) then
        note_user(view, "aigc: cannot add feature " .. feature .. " to your --constraint; left unchanged")
        return
    end
    push(view, "add_features", feature)
    push(view, "feature_why", why)
end

-- The SM fraction (0..1] a job is expected to use while it computes, and where it came from:
-- the agents' history for this user and job name (`learned.sm`: `view.learned`, set before the
-- rules run by the learned-defaults code, or nil), else the policy's figure for its class.
local function expected_sm(class, learned)
    local sm = type(learned) == "table" and learned.sm or nil
    if type(sm) == "number" and sm > 0 and sm <= 1 then return sm, "learned" end  -- NaN fails both
    return P.rewrites.shard.expected_sm[class], "class"
end

-- The fewest shards of type t a shard job asks for. Slurm 22.05 gives a GPU whole once one of
-- its shard jobs ends, while all the others still run there (three 5-shard jobs on a t4, one
-- cancelled: a gpu:1 job got that t4 beside the other two, measured on 22.05.8,
-- tests/integration/test_slurm_shards.py). rule_whole_as_shards judges a whole job's risk by the
-- one largest shard job left beside it, so where that rule is on, a shard job asks for more
-- than a third of a GPU's shards and at most two share a GPU, whatever a learned SM allows.
local function fewest_shards(t)
    return P.rewrites.whole_as_shards.enabled and floor(t.shards_per_gpu / 3) + 1 or 1
end

-- Shards the job needs on GPU type t: its memory, and its SM share of the GPU (at least one,
-- never `shard:0`). Slurm shards isolate nothing, so the compute share is the only cap on how
-- many co-tenants a GPU gets.
local function shards_needed(t, vram, sm)
    return max(ceil(vram / t.gib_per_shard - 1e-9), ceil(sm * t.shards_per_gpu - 1e-9), fewest_shards(t))
end

-- The most GiB one shard job may hold on type t, which the memory guard lets it use: the shards
-- the shard rule asks there for the largest job it shares (a vram of max_fraction of the GPU,
-- an SM of max_sm).
local function largest_shard_gib(t)
    local cfg = P.rewrites.shard
    local shards = shards_needed(t, cfg.max_fraction * t.memory_gib, cfg.max_sm)
    return (shards < t.shards_per_gpu and shards or t.shards_per_gpu) * t.gib_per_shard
end

-- One count N for every type (a GRES request has one), taken from the need on one type: the job
-- may run on type t when N covers its need there and fits one GPU. The N keeping the most types
-- wins; on a tie the smaller type's (TYPES ascend by memory): the big GPUs are the ones that
-- jobs too big for the small ones queue for (rule_vram_fit). Returns N and the kept types, or nil.
local function shard_plan(vram, sm, max_fraction)
    local fits = {}
    for _, t in ipairs(TYPES) do
        if t.shards_per_gpu > 0 and vram <= max_fraction * t.memory_gib then
            fits[#fits + 1] = { type = t, need = shards_needed(t, vram, sm) }
        end
    end
    local best, best_kept = nil, {}
    for _, candidate in ipairs(fits) do
        local n, kept = candidate.need, {}
        for _, other in ipairs(fits) do
            if other.need <= n and n <= other.type.shards_per_gpu then kept[#kept + 1] = other.type end
        end
        if #kept > #best_kept then best, best_kept = n, kept end
    end
    return best, best_kept
end

-- The shard request of a one-GPU job of `class` that needs `vram` GiB: N, the types kept, and
-- the expected SM and its source; nil (and the SM) when the job is not to be shared.
local function shard_request(class, vram, learned)
    local cfg = P.rewrites.shard
    local sm, source = expected_sm(class, learned)
    if not sm or sm > cfg.max_sm then return nil, nil, sm, source end
    local shards, allowed = shard_plan(vram, sm, cfg.max_fraction)
    return shards, allowed, sm, source
end
M.shard_request = shard_request

-- The job's GPU entry `gpu` becomes `shard:N` per node (a per-job count moves to tres_per_node:
-- a one-node job's count is its node's).
local function ask_shards(view, gpu, shards, why)
    local entry = gpu.prefix .. SHARD_GRES .. (gpu.sep == "=" and "=" or ":") .. shards
    if gpu.field == "tres_per_node" then
        plan(view, "tres_per_node", replace_entry(gpu.value, gpu.index, entry), why)
    else
        plan(view, "tres_per_job", replace_entry(gpu.value, gpu.index, nil), why)
        local per_node = current(view, "tres_per_node")
        plan(view, "tres_per_node", (per_node and per_node ~= "") and (per_node .. "," .. entry) or entry, why)
    end
end

-- A GPU request a rule may turn into shards: one GPU on one node, per node or per job, without
-- --cpus-per-gpu/--mem-per-gpu (which Slurm ties to the GPU count), at submit only: Slurm 22.05
-- refuses a GRES change in `scontrol update` of a pending job ("Invalid generic resource (gres)
-- specification"), failing the whole update.
local function shardable(view, gpu)
    if view.modify or gpu.count ~= 1 or not single_node(view) then return false end
    if gpu.field ~= "tres_per_node" and gpu.field ~= "tres_per_job" then return false end
    return not get(view, "cpus_per_tres") and not get(view, "mem_per_tres")
end

local function rule_shard(view)
    local cfg = P.rewrites.shard
    local tags, gpu = view.tags, view.gpu
    if not cfg.enabled or not SHARD_CLASSES[view.class] or not gpu or not tags or not tags.vram then return end
    if tags.share == false or gpu.type or not shardable(view, gpu) then return end
    local vram = tags.vram
    local shards, allowed, sm, source = shard_request(view.class, vram, view.learned)
    if not shards then
        if DEBUG then log_debug("aigc: not shared: expected SM %s (%s)", tostring(sm), tostring(source)) end
        return
    end
    local why = format("shard: vram=%gG, SM %g (%s) -> %d shard(s)", vram, sm, source, shards)
    if not restrict_types(view, allowed, why) then return end
    ask_shards(view, gpu, shards, why)
    view.sharded = true
    -- A fraction of a GPU starts in gaps no whole-GPU job can use, so it goes ahead in the queue:
    -- Slurm's main scheduler stops at the first job it cannot start, and a shard job behind a
    -- whole-GPU job waits for backfill. A nice the user chose is kept (users may only raise it).
    local nice = get(view, "nice")
    if cfg.nice ~= 0 and (nice == nil or nice == NO_VAL) then
        plan(view, "nice", NICE_OFFSET + cfg.nice, format("shard: a fraction of a GPU goes ahead (nice %d)", cfg.nice))
    end
end

-- A misfit of the user's vram= is theirs to fix (noted, or rejected in strict mode). A learned
-- vram is the table's guess (p95 of the key's peaks + a margin: 17G for jobs that filled a
-- 16 GB T4): it is dropped, never a reason to reject or to say the user declared it.
local function vram_misfit(view, declared, learned)
    if view.learned_vram then
        view.tags.vram = nil
        note_user(view, "aigc: " .. learned .. "; not used")
    else
        view.type_misfit = declared
    end
end

local function rule_vram_fit(view)
    local cfg = P.rewrites.vram_fit
    local tags, gpu = view.tags, view.gpu
    if not cfg.enabled or view.sharded or not gpu or not tags or not tags.vram then return end
    local vram = tags.vram
    if gpu.type then
        local t = type_by_name(gpu.type)
        if t and t.memory_gib < vram then
            vram_misfit(view, format("you asked for %s GPUs (%gG) but declared vram=%gG", t.name, t.memory_gib, vram),
                format("the learned vram=%gG does not fit the %s GPUs (%gG) you asked for", vram, t.name, t.memory_gib))
        end
        return
    end
    local allowed = {}
    for _, t in ipairs(TYPES) do
        if t.memory_gib >= vram then allowed[#allowed + 1] = t end
    end
    if #allowed == 0 then
        vram_misfit(view, format("no GPU type has vram=%gG", vram), format("the learned vram=%gG fits no GPU type", vram))
        return
    end
    restrict_types(view, allowed, format("vram_fit: vram=%gG", vram))
end

local function rule_nvlink(view)
    local cfg = P.rewrites.nvlink
    local tags = view.tags or {}
    if not cfg.enabled or view.sharded or tags.nvlink == false then return end
    if not (NVLINK_CLASSES[view.class] or tags.nvlink == true) then return end
    local per_node = gpus_per_node(view)
    if not per_node or per_node < 2 or not single_node(view) then return end
    local why = format("nvlink: %d GPUs on one node", per_node)
    if cfg.method == "feature" then
        add_feature(view, cfg.feature, why)
        return
    end
    local allowed = {}
    for _, t in ipairs(TYPES) do
        if t.nvlink and (view.gpu.type == nil or view.gpu.type == t.name) then allowed[#allowed + 1] = t end
    end
    if #allowed == 0 then
        note_user(view, "aigc: no NVLink GPU type matches your request; NVLink not enforced")
        return
    end
    restrict_types(view, allowed, why)
end

-- Slurm 22.05 gives a GPU whole (`gpu:1`) to the next job once one of two shard jobs on it ends,
-- while the other still runs there (docs/hook.md): a whole-GPU job that does not fit beside it
-- then fails out of memory at once, before the controller's next tick can act. What 22.05 keeps
-- right is its shard count: a one-GPU job asking for the GPU as all of its shards waits until
-- no shard job holds any of it, and no `gpu:1` job is given a GPU so held (measured on 22.05.8,
-- tests/integration/test_slurm_shards.py). So where the policy renders this rule on (`auto`:
-- the Slurm release `policy install` found is older than the first one measured without the
-- defect), a one-GPU whole job asks for all the shards of one GPU type instead of `gpu:1`.
-- Only where the job is at risk: where its vram= is over the GPU's memory less the largest shard
-- job the shard rule puts there (largest_shard_gib: 8 GiB of a 16 GiB t4 as shipped; one, as
-- fewest_shards lets at most two share a GPU), where its vram is unknown, or wherever when it
-- asked `share=no` (a GPU of its own). A job that fits beside a shard job keeps `gpu:1`: on
-- 22.05 it may then share a GPU, as before, and the controller acts if the jobs on it fill its
-- memory; asking it as shards too cost the 4-node benchmark a fifth of its jobs
-- (docs/benchmarks.md), as it waits for GPUs that it and a shard job could share.
-- A GRES request has one count, so the job's types must agree on it: a typed request, or types
-- that share a shard count; else (vram= known) the smallest of its types with memory above its
-- vram: pinned there as shards when at risk there (a 13 GiB fine-tune: t4, shard:16); when not,
-- only the smaller types were, which it would fill to the brim, and they are dropped with
-- `gpu:1` kept (a 16 GiB job: a100). Multi-GPU jobs cannot be asked this way; the controller
-- still handles theirs.
local function shared_count(types)
    local count = types[1] and types[1].shards_per_gpu or 0
    for _, t in ipairs(types) do
        if t.shards_per_gpu ~= count then return nil end
    end
    return count > 0 and count or nil
end

-- (types, true): all of one GPU's shards on those types; (types, false): `gpu:1`, kept to those
-- types; nil: the job as it is.
local function whole_shard_plan(view, gpu)
    local tags = view.tags or {}
    local vram = tags.vram
    local function at_risk(t)
        return tags.share == false or not vram or vram > t.memory_gib - largest_shard_gib(t)
    end
    local types = view.allowed_list or TYPES
    if gpu.type then
        local t = type_by_name(gpu.type)
        if not t or t.shards_per_gpu == 0 then return nil end
        types = { t }
    end
    local safe = {}
    for _, t in ipairs(types) do
        if not at_risk(t) then safe[#safe + 1] = t end
    end
    if #safe == #types then return nil end
    if shared_count(types) then return types, true end
    if not vram then return nil end
    for _, t in ipairs(types) do  -- ascending memory
        if t.memory_gib > vram then
            if at_risk(t) then return { t }, true end
            return safe, false
        end
    end
    return nil
end

local function rule_whole_as_shards(view)
    local gpu = view.gpu
    if not P.rewrites.whole_as_shards.enabled or view.sharded or not gpu or view.class == "unknown" then return end
    if not shardable(view, gpu) then return end
    local types, as_shards = whole_shard_plan(view, gpu)
    if not types then return end
    if not as_shards then
        restrict_types(view, types, format("whole_as_shards: vram=%gG would fill a smaller GPU beside a shard job "
            .. "(the Slurm 22.05 shard defect)", view.tags.vram))
        return
    end
    local shards = types[1].shards_per_gpu
    local why = format("whole_as_shards: one whole %s GPU as shard:%d (the Slurm 22.05 shard defect)",
        types_expr(types) or types[1].name, shards)
    if not restrict_types(view, types, why) then return end
    ask_shards(view, gpu, shards, why)
end

-- Slurm rejects a job whose --prefer names a feature no node has ("Invalid preferred feature
-- specification"), and one whose --prefer no node satisfies together with its other features
-- ("Requested node configuration is not available", measured on 22.05: `a100&model_X` while
-- only a t4 served X). So a model feature is preferred only while the publisher lists it in
-- `published_features_file`, one line per node: the model feature, then that node's other
-- features (a line of the feature alone: a node with no other feature, which satisfies no
-- constraint; it once meant "any node", from publishers that wrote no header, whose listings
-- are now empty anyway); re-read at most every `refresh_seconds`.
--
-- The listing is trusted only while it is fresh. Its first line, `# written <epoch>`, is when
-- the publisher last wrote it, and a live publisher rewrites it every cycle. After a slurmctld
-- restart or `scontrol reconfigure` Slurm has forgotten every model feature, and only a live
-- publisher puts them back; a stopped or failing one (controller down, database down, dry-run,
-- `--no-publisher`) leaves the old listing behind. A listing older than `max_age_seconds`
-- (three publisher cycles plus `refresh_seconds`, rendered by slurm_aigc/policy/render.py),
-- dated that far ahead of our clock, or without the line (an older publisher) counts as empty:
-- no --prefer, the job goes through as the user wrote it.
--
-- This cache is the hook's only state that outlives a call. Slurm 23.02+ may run job_submit
-- calls concurrently, but job_submit/lua serialises every call into its one Lua state with
-- its own mutex (Lua states are not thread-safe), so no two calls interleave here. A read
-- still replaces the cache whole, only once it is complete: an error half-way through
-- (caught by the entry's pcall) leaves the previous listing and its time in place.
local published, published_written, published_read_at = nil, nil, nil
local NOTHING_PUBLISHED = {}

local function add_published_line(listing, line)
    local word, rest = match(line, "^%s*([%w_%.%-]+)(.*)$")
    if not word then return end
    local set = {}
    for other in string.gmatch(rest, "[%w_%.%-]+") do set[other] = true end
    local sets = listing[word] or {}
    sets[#sets + 1] = set
    listing[word] = sets
end

-- (listing, the header's epoch or nil).
local function read_published(path)
    local listing, written, first = {}, nil, true
    local handle = io.open(path, "r")
    if not handle then return listing, nil end
    for line in handle:lines() do
        if first then written = tonumber(match(line, "^# written (%d+)%s*$")) end
        first = false
        add_published_line(listing, line)
    end
    handle:close()
    return listing, written
end

local function published_features(cfg)
    if not cfg.published_features_file then return nil end
    local now = os.time()
    if not (published_read_at and now - published_read_at < cfg.refresh_seconds) then
        local listing, written = read_published(cfg.published_features_file)
        published, published_written, published_read_at = listing, written, now
    end
    local written, max_age = published_written, cfg.max_age_seconds
    if not written or now - written > max_age or written - now > max_age then
        if DEBUG then log_debug("aigc: published features listing is stale or has no header; no --prefer") end
        return NOTHING_PUBLISHED
    end
    return published
end

-- Does one listed node (a feature set) satisfy `expr`: words joined by & of alternatives
-- (`a`, `a|b`, `(a|b)`)? Anything more complex reads as "cannot tell": no --prefer.
local function node_satisfies(expr, set)
    for term in string.gmatch(expr, "[^&]+") do
        local ok = false
        for alternative in string.gmatch(string.gsub(term, "[()]", ""), "[^|]+") do
            if set[alternative] then ok = true; break end
        end
        if not ok then return false end
    end
    return true
end

local function some_node_satisfies(expr, sets)
    if expr == nil or expr == "" then return true end
    if not match(expr, "^[%w_%.%-&|()]+$") or (find(expr, "|", 1, true) and find(expr, "&", 1, true)
            and not find(expr, "(", 1, true)) then
        return false
    end
    for _, set in ipairs(sets) do
        if node_satisfies(expr, set) then return true end
    end
    return false
end

local function rule_model_prefer(view)
    local cfg = P.rewrites.model_prefer
    local tags = view.tags
    if not cfg.enabled or not tags or not tags.model then return end
    -- The job record shows the hook no `prefer` (job_submit/lua on 22.05 to 26.05), so on a
    -- modify the job's own --prefer is unknown and would be replaced: only an update that
    -- sets one is added to.
    if view.modify and view.desc.prefer == nil then return end
    local feature = sub(cfg.feature_prefix .. tags.model, 1, MAX_FEATURE_LEN)
    local known = published_features(cfg)
    if known and not known[feature] then
        if DEBUG then log_debug("aigc: no node publishes %s yet; no --prefer", feature) end
        return
    end
    -- Slurm 22.05 schedules a job first with its --prefer *instead of* its --constraint, so the
    -- preference must repeat the constraint (user's and ours) or it could escape it.
    local prefer = get(view, "prefer")
    if prefer ~= nil and prefer ~= "" then
        if not match(prefer, "^[%w_%.%-&]+$") or has_word(prefer, feature) then return end
    else
        prefer = current(view, "features")
        if prefer ~= nil and prefer ~= "" and not simple_features(prefer) and not match(prefer, "^[%w_%.%-&|()]+$") then
            return
        end
    end
    if known and not some_node_satisfies(prefer, known[feature]) then
        if DEBUG then log_debug("aigc: no node with %s also has %s; no --prefer", feature, prefer or "") end
        return
    end
    if prefer == nil or prefer == "" then
        prefer = feature
    elseif find(prefer, "|", 1, true) then
        prefer = "(" .. prefer .. ")&" .. feature
    else
        prefer = prefer .. "&" .. feature
    end
    plan(view, "prefer", prefer, "model_prefer: model=" .. tags.model)
end

local function rule_class_defaults(view)
    if not P.rewrites.class_defaults.enabled then return end
    local defaults = P.classes[view.class]
    if not defaults then return end
    local why = "class_defaults: class=" .. view.class
    local partition = defaults.partition
    -- Only a partition the user may use (part_list holds exactly those), so Slurm won't refuse it.
    if partition and get(view, "partition") == nil and view.parts and view.parts[partition] ~= nil then
        plan(view, "partition", partition, why)
    end
    if defaults.qos and get(view, "qos") == nil then plan(view, "qos", defaults.qos, why) end
    local minutes = defaults.time_minutes
    local limit = get(view, "time_limit")
    if minutes and (limit == nil or limit == NO_VAL) then
        local part = view.parts and view.parts[current(view, "partition") or ""]
        local max_time = part and part.max_time
        if max_time == nil or max_time == NO_VAL or max_time == INFINITE or minutes <= max_time then
            plan(view, "time_limit", minutes, why)
        end
    end
end

-- `aigc_class=<class>[ aigc_reclaim=no][ aigc_share=no][ aigc_signal=<signal>][ aigc_learned=1]`
-- for the AdminComment. The signal is the user's `aigc:signal=` declaration: job_submit/lua
-- exposes no `--signal` field (22.05 to 26.05), and the declaration can only let the reclaim
-- `signal` rung reach the user's own job.
local function stamp_text(view)
    local text = STAMP_CLASS .. view.class
    local tags = view.tags
    if tags and tags.reclaim == false then text = text .. " " .. STAMP_RECLAIM .. "no" end
    if tags and tags.share == false then text = text .. " " .. STAMP_SHARE .. "no" end
    if tags and tags.signal then text = text .. " " .. STAMP_SIGNAL .. tags.signal end
    if view.learned_applied then text = text .. " " .. STAMP_LEARNED .. "1" end
    return text
end

-- The trusted stamp (slurm_aigc/tags.py): written into the AdminComment at submit, replacing
-- any stamp a crafted request carried. Not on modify: 22.05 refuses a whole `scontrol update`
-- by a job owner when job_modify sets admin_comment, so the class stays the one stamped at
-- submit. Stamp-like words a user wrote into the comment are removed.
local function plan_stamp(view)
    if view.modify then return end
    local _, _, rest = stamp_of(get(view, "admin_comment"))
    local value = stamp_text(view)
    if rest ~= nil and rest ~= "" then value = value .. "; " .. rest end
    plan(view, "admin_comment", value, "stamp", true)
end

local function rule_stamp(view)
    plan_stamp(view)
    if view.modify and view.desc.comment == nil then return end
    local comment = current(view, "comment")
    if type(comment) ~= "string" then return end
    local cleaned = without_stamp_words(comment)
    if cleaned ~= comment then plan(view, "comment", cleaned, "stamp: aigc_<key>= words are the hook's own") end
end

-- Writes the one --constraint expression: the user's AND list, then the GPU types, then features.
local function rule_features(view)
    local parts = {}
    if view.allowed_list then parts[1] = types_expr(view.allowed_list) end
    for _, feature in ipairs(view.add_features or {}) do parts[#parts + 1] = feature end
    if #parts == 0 then return end
    local features = get(view, "features")
    for _, part in ipairs(parts) do
        if features == nil or features == "" then
            features = part
        elseif not has_word(features, part) then
            features = features .. "&" .. part
        end
    end
    plan(view, "features", features, table.concat(view.feature_why, "; "))
end

local RULES = { rule_shard, rule_vram_fit, rule_nvlink, rule_whole_as_shards, rule_features, rule_model_prefer,
    rule_class_defaults, rule_stamp }
for i = 1, 8 do assert(RULES[i], "aigc: rule " .. i .. " of RULES is undefined") end

-- ---------------------------------------------------------------------------------------------
-- Messages and applying the plan.

local function show(value)
    if value == nil then return "(unset)" end
    return tostring(value)
end

-- A field's value as users write it: nice without its offset.
local function show_field(field, value)
    if field == "nice" and type(value) == "number" then
        return value == NO_VAL and "(unset)" or tostring(value - NICE_OFFSET)
    end
    return show(value)
end

local function tag_error_text(problems)
    local parts = {}
    for _, p in ipairs(problems) do
        parts[#parts + 1] = format("'%s' (%s: %s)", p.text, p.why, p.fix)
    end
    return "aigc: bad tag in --comment: " .. table.concat(parts, "; ")
end

-- Writes the planned fields; on any error restores what it already wrote and re-raises.
local function apply(view)
    local desc, done = view.desc, {}
    local ok, err = pcall(function()
        for _, change in ipairs(view.plan) do
            desc[change.field] = change.value
            done[#done + 1] = change
        end
    end)
    if ok then return end
    for i = #done, 1, -1 do
        local change = done[i]
        pcall(function()
            local before = change.before
            if before == nil then before = (type(change.value) == "number") and NO_VAL or "" end
            desc[change.field] = before
        end)
    end
    error(err, 0)
end

-- slurmctld 22.05 discards user messages from job_modify with an error line, so an update
-- only logs; a submission also tells the user.
local function announce(view)
    local name, uid, tell = show(get(view, "name")), view.uid, not view.modify
    for _, change in ipairs(view.plan) do
        if not change.quiet then
            local before, after = show_field(change.field, change.before), show_field(change.field, change.value)
            log_info("aigc: rewrite uid=%s name=%s class=%s %s: %s -> %s (%s)", tostring(uid), name,
                view.class, change.field, before, after, change.why)
            if tell then
                slurm.log_user("aigc: %s: %s %s -> %s", change.why, change.field, before, after)
            end
        elseif DEBUG then
            log_debug("aigc: %s uid=%s: %s", change.why, tostring(uid), show(change.value))
        end
    end
    for _, text in ipairs(view.notes or {}) do
        if tell then slurm.log_user("%s", text) else log_info("aigc: uid=%s: %s", tostring(uid), text) end
    end
end

-- ---------------------------------------------------------------------------------------------
-- Entry points (called by job_submit.lua inside pcall).

-- `type=interactive` is what Slurm says of a job without a batch script (srun/salloc); a
-- batch job (or a later hetjob component, see is_interactive) claiming it would be exempt
-- from reclaim, so the claim is a tag error.
local function check_claim(view, tags, problems)
    if not tags or tags.type ~= "interactive" or is_interactive(view) or view.uid == 0 then return problems end
    tags.type = nil
    problems = problems or {}
    problems[#problems + 1] = { text = "type=interactive", why = "not an srun/salloc job",
        fix = "interactive is set for jobs without a batch script (in a hetjob, its first component only); "
            .. "use another class" }
    return problems
end

-- ---------------------------------------------------------------------------------------------
-- Learned defaults for untagged jobs (policy `learned:`; slurm_aigc/telemetry/learned.py says
-- how the controller learns them and why each rule exists). Most jobs carry no tag, so the
-- rules above would give them nothing; their owner's earlier jobs with a similar name tell
-- the class, the VRAM need and the SM share (the SM also for tagged jobs of that class).

local LEARNED = P.learned and P.learned.enabled and P.learned or nil
local PATTERN_READ = 128  -- bytes of the name a key is made from (learned.py PATTERN_READ)
local COUNTER_PREFIXES = set_of({ "v", "r", "p", "run", "job", "seed", "step", "ep", "epoch", "iter", "trial", "part",
    "task", "try", "rep", "shard" })

-- A counter, date, hash or timestamp word: dropped from the end of a name's key.
local function id_like(word)
    if match(word, "^%d+$") then return true end
    if #word >= 8 and match(word, "^[0-9a-f]+$") and find(word, "%d") then return true end
    if match(word, "^%d%d%d%d%d%d%d%dt%d+z?$") then return true end
    local prefix = match(word, "^(%l+)%d+$")
    return prefix ~= nil and COUNTER_PREFIXES[prefix] == true
end

-- `SD_Gen.0042` -> `sd-gen`: the first PATTERN_READ bytes, ASCII lower-cased, split into words
-- at every ASCII byte that is not a letter or digit (non-ASCII bytes are word bytes), trailing
-- id-like words dropped (never the first), joined by `-`. Same as learned.py `name_pattern`
-- (a property test holds them equal). Plain words only: nothing in a key is a pattern.
local function learned_key(name)
    if type(name) ~= "string" then return "" end
    local words = {}
    for word in gmatch(lower(sub(name, 1, PATTERN_READ)), "[a-z0-9\128-\255]+") do words[#words + 1] = word end
    while #words > 1 and id_like(words[#words]) do words[#words] = nil end
    return table.concat(words, "-")
end
M.learned_key = learned_key

-- One entry per line: `uid pattern class vram_gib sm ...` (learned.py format_table; `-` = none).
-- A class the policy does not have (or interactive), a VRAM that is not a positive number or an
-- SM outside 0..1 is dropped (NaN fails every comparison); at most max_entries lines are read.
local function learned_entry(class, vram, sm)
    local entry = { class = (CLASS_SET[class] and class ~= "interactive") and class or nil }
    vram, sm = tonumber(vram), tonumber(sm)
    if vram and vram > 0 and vram < 1048576 then entry.vram = vram end
    if sm and sm >= 0 and sm <= 1 then entry.sm = sm end
    return entry
end

local function read_learned(path, max_entries)
    local entries, count = {}, 0
    local handle = io.open(path, "r")
    if not handle then return entries end
    for line in handle:lines() do
        local uid, pattern, class, vram, sm = match(line, "^(%d+) (%S+) (%S+) (%S+) (%S+)")
        if uid then
            entries[uid .. " " .. pattern] = learned_entry(class, vram, sm)
            count = count + 1
            if count >= max_entries then break end
        end
    end
    handle:close()
    return entries
end

-- The file is written by the controller only (root, 0644, in a root-owned directory; Lua 5.1
-- cannot stat it cheaply, so `slurm-aigc learned show` checks owner and mode, docs/security.md).
-- Like the published features, the table is the hook's state between calls: job_submit/lua
-- serialises every call (its own mutex), and a read replaces it whole only once complete.
local learned_table, learned_read_at = nil, nil

local function learned_entries()
    local now = os.time()
    if learned_read_at and now - learned_read_at < LEARNED.refresh_seconds then return learned_table end
    local entries = read_learned(LEARNED.file, LEARNED.max_entries)
    learned_table, learned_read_at = entries, now
    return learned_table
end

-- A job whose tag gives no `type` (or that has no tag): its owner's learned entry for its name
-- fills the keys the tag leaves out (class, vram), so the rules (shard, vram_fit, nvlink,
-- whole_as_shards, class_defaults) apply as if the user had tagged them. `view.learned` = {class, vram, sm, key}
-- (sm 0..1, read by rule_shard). A job tagged with a `type` keeps its tag whole; its history
-- refines only the SM it is expected to draw (`view.learned` = {sm, key}), and only a history of
-- the class it declares: the class default is a guess for every user's jobs of that class, the
-- key's highest SM is this user's own measure for jobs of this name. Submit only, never root's
-- jobs (never rewritten), never an interactive job's, never a job without GPUs: a CPU job named
-- like its owner's GPU jobs (the data preparation before them) would get the GPU class's qos and
-- time limit.
local function learned_defaults(view, tags)
    if not LEARNED or view.modify or view.uid == 0 then return tags end
    if not asks_gpu(view) then return tags end
    local key = learned_key(get(view, "name"))
    if key == "" then return tags end
    -- %d: slurmctld pushes the uid as a Lua number, a float in Lua 5.3+ ("1001.0" by tostring).
    local entry = learned_entries()[format("%d", view.uid) .. " " .. key]
    if not entry then return tags end
    local typed = tags and tags.type
    if typed and not (entry.class == typed and entry.sm) then return tags end
    -- Learning cannot grant `interactive` (learned.py), nor take it away: an salloc named like
    -- its owner's batch jobs stays an exempt session. Checked last: it may read the script.
    if is_interactive(view) then return tags end
    if typed then
        view.learned = { sm = entry.sm, key = key }
        return tags
    end
    view.learned = { class = entry.class, vram = entry.vram, sm = entry.sm, key = key }
    tags = tags or {}
    local used = {}
    if entry.class then tags.type = entry.class; used[#used + 1] = "type=" .. entry.class end
    if entry.vram and tags.vram == nil then
        tags.vram, view.learned_vram = entry.vram, true
        used[#used + 1] = format("vram=%gG", entry.vram)
    end
    if #used > 0 then
        view.learned_applied = true
        note_user(view, format("aigc: from your earlier jobs named like '%s': %s (learned; a tag overrides it)",
            key, table.concat(used, ",")))
    end
    return tags
end

-- The class the rules use: the tag's `type`, else the detection rules. On modify this may
-- differ from the stamp written at submit, which stays (22.05 refuses an owner's update that
-- sets admin_comment): a re-tag changes how the owner's own job is placed, never what the
-- daemons believe.
local function job_class(view, tags)
    return tags and tags.type or detect_class(view)
end

-- Returns (rc, class).
local function run(view)
    local comment = get(view, "comment")
    local tags, problems = parse_tags(comment)
    problems = check_claim(view, tags, problems)
    tags = learned_defaults(view, tags)
    view.tags = tags
    if tags ~= nil or DETECTION_NEEDS_GPUS then
        local gpu, ambiguous = find_gpu(view)
        view.gpu = gpu
        if ambiguous and DEBUG then log_debug("aigc: GPU request not understood, not rewritten") end
    end
    local class = job_class(view, tags)
    view.class = class
    if view.uid == 0 and P.hook.skip_root then
        -- Root's job is never rewritten, but stamped (root's own stamp, if any, is kept) so
        -- the daemons and reports know its class too.
        if next((stamp_of(get(view, "admin_comment")))) == nil then
            plan_stamp(view)
            apply(view)
        end
        return slurm.SUCCESS, class
    end
    -- A malformed tag is rejected in strict mode whatever the class: the user meant to tag.
    if problems and STRICT then
        local text = tag_error_text(problems)
        log_info("aigc: reject uid=%s: %s", tostring(view.uid), text)
        slurm.log_user("%s", text)
        return slurm.ERROR, class
    end
    if problems then note_user(view, tag_error_text(problems) .. " -- ignored") end
    if UNTOUCHED[class] then
        rule_stamp(view)  -- left as submitted, but the daemons must know its class
    else
        for _, rule in ipairs(RULES) do rule(view) end
    end
    if view.type_misfit then
        local text = "aigc: " .. view.type_misfit .. "; fix --gres or vram="
        if STRICT and P.rewrites.vram_fit.reject_misfit then
            slurm.log_user("%s", text)
            return slurm.ERROR, class
        end
        note_user(view, text)
    end
    apply(view)
    -- The job is already rewritten: a failing log call must not make the caller think otherwise.
    pcall(announce, view)
    return slurm.SUCCESS, class
end

function M.submit(job_desc, part_list, submit_uid)
    return run(job_view(job_desc, nil, part_list, submit_uid, false))
end

-- An admin's (or a daemon's) `scontrol update AdminComment=...` keeps the job's stamp in
-- front: stamp words the new text gives win, the others are carried over. Only admins may
-- set admin_comment, so this never fails an update.
local function keep_stamp(job_desc, job_rec)
    local new = job_desc.admin_comment
    if new == nil then return end
    local old_found, old_text = stamp_of(job_rec.admin_comment)
    if old_text == "" then return end
    local new_found, new_text, rest = stamp_of(new)
    local words = { new_text ~= "" and new_text or nil }
    for word in gmatch(old_text, "%S+") do
        if new_found[match(word, "^aigc_(%l+)=")] == nil then words[#words + 1] = word end
    end
    local merged = table.concat(words, " ")
    if merged == new_text then return end
    job_desc.admin_comment = (rest ~= "") and (merged .. "; " .. rest) or merged
end

-- `scontrol update` of a pending job: same rules over (new fields, else the job's record),
-- run only when the update touches the comment or a GPU request.
function M.modify(job_desc, job_rec, part_list, modify_uid)
    keep_stamp(job_desc, job_rec)
    -- The base state only: flags above it (JOB_RESV_DEL_HOLD; JOB_UPDATE_DB on an array's
    -- pending record up to 24.05) would make a pending job look otherwise.
    if job_rec.job_state % JOB_STATE_FLAGS_AT ~= JOB_PENDING then return slurm.SUCCESS, nil end
    local touched = job_desc.comment ~= nil
    for _, field in ipairs(GRES_FIELDS) do
        if job_desc[field] ~= nil then touched = true end
    end
    if not touched then return slurm.SUCCESS, nil end
    return run(job_view(job_desc, job_rec, part_list, modify_uid, true))
end

return M
