-- job_submit.lua: the thin entry of the slurm-aigc hook (the last part of the rendered file).
--
-- `slurm-aigc policy install` prepends the policy table and aigc_hook.lua as `AIGC_HOOK`.
-- Any error raised by our code is caught here: the job is logged and accepted unchanged
-- (slurmctld 22.05.8 lets a job through when the script raises, other versions reject it,
-- so we never let an error escape). A job is rejected only when the policy says so.

local hook = AIGC_HOOK
local pcall, tostring = pcall, tostring

-- Class of the last job seen; read by `slurm-aigc classify` only.
AIGC_LAST_CLASS = nil
-- The hook's pure helpers, for `slurm-aigc` in lupa (slurm_aigc/tags.py is held equal to them).
AIGC_PURE = { parse_tags = hook.parse_tags, stamp_of = hook.stamp_of, glob_matches = hook.glob_matches,
    shard_request = hook.shard_request, learned_key = hook.learned_key }

local function guarded(entry, ...)
    local ok, rc, class = pcall(entry, ...)
    if ok then
        AIGC_LAST_CLASS = class
        return rc
    end
    AIGC_LAST_CLASS = nil
    -- The error may quote a job's name or comment: escaped like every other line we log.
    local escaped, text = pcall(hook.log_text, tostring(rc))
    pcall(slurm.log_error, "aigc: hook error, job accepted unchanged: %s", escaped and text or "(unprintable)")
    return slurm.SUCCESS
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    return guarded(hook.submit, job_desc, part_list, submit_uid)
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    return guarded(hook.modify, job_desc, job_rec, part_list, modify_uid)
end

return slurm.SUCCESS
