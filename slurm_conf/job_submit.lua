--[[
job_submit.lua for gpu-bridge (slurmctld's job_submit/lua plugin; JobSubmitPlugins=lua).
Install next to slurm.conf (e.g. /etc/slurm/job_submit.lua); slurmctld re-reads it when it
changes. Tested on Slurm 22.05 (Debian 12) by tests/integration/test_job_submit_lua.py.

What it enforces, for the nodes gpu-bridge lends to Slurm:
  * Every job of the preemptible partition is requeueable: gpu-bridge reclaims a node by
    preempting its jobs with REQUEUE, so a job that cannot be requeued would be lost.
    Unset -> set to requeue; an explicit --no-requeue is rejected with a message saying why.
    `scontrol update JobId=N Requeue=0` on such a job is rejected the same way, and so is
    moving a job into the preemptible partition without making it requeueable in the same
    update (`scontrol update JobId=N Partition=preempt` is refused; `... Requeue=1` is fine).
  * The hold partition (gpu-bridge) and the hold job name prefix (gpu-bridge-hold:) belong
    to the bridge, and so do warm lending's memory-hold partition (gpu-bridge-warm) and its
    job name prefix (gpu-bridge-warm:): submissions there, or renames to those names, by anyone
    else are rejected (AllowGroups= in slurm.conf enforces the partitions too; this gives the
    clear message). A researcher cannot fake a hold or a memory hold (which would keep a node
    counted as serving, or as lent warm), because gpu-bridge reads them by partition and name.
    "The bridge" is the uid slurmctld authenticated for the request (submit_uid / modify_uid),
    never a user name the request carries.
  * The optional fast-grace tier (FAST_PARTITION, e.g. `preempt-fast`: GraceTime of seconds,
    same nodes, preempted first on a surprise) takes only jobs that are honest about it: the
    same requeue rule as `preempt`, and either short (--time <= FAST_MAX_TIME_MIN minutes) or
    declaring in their comment that they save on the signal within the fast grace
    (--comment=gpu-bridge:save-on-signal=<s>, s <= FAST_GRACE_S). Checked on submission and on
    every update that moves a job in, lengthens its time or rewrites its comment.
  * Research jobs get the environment variable GPU_BRIDGE_GRACE_S (the preemptible
    partition's GraceTime; FAST_GRACE_S in the fast tier), so a job script knows how long it has to checkpoint, and
    GPU_BRIDGE_REQUEUE_EXIT (slurm.conf's RequeueExit), the code to exit with after saving
    on the signal so that Slurm requeues the job whenever it exits.

The default pre-preemption signal (--signal=B:URG@<grace>) cannot be set here: Slurm's
job_submit/lua does not expose the job's warn_signal/warn_time fields (22.05 to 25.x).
cli_filter.lua (CliFilterPlugins=cli_filter/lua) sets it on the client side instead.
--]]

-- Site settings --------------------------------------------------------------------------
local PREEMPT_PARTITION = "preempt"        -- bridge.wellknown.SLURM_PREEMPT_PARTITION
local HOLD_PARTITION = "gpu-bridge"        -- bridge.wellknown.SLURM_HOLD_PARTITION
local HOLD_JOB_PREFIX = "gpu-bridge-hold:" -- bridge.wellknown.SLURM_HOLD_JOB_PREFIX
local WARM_PARTITION = "gpu-bridge-warm"   -- gpu-bridge.yaml slurm.warm_partition
local WARM_JOB_PREFIX = "gpu-bridge-warm:" -- bridge.wellknown.SLURM_WARM_HOLD_JOB_PREFIX
-- Uids that may use the bridge's partitions and job names (root always may): the uid the
-- gpu-bridge daemon runs as (`id -u gpu-bridge`), e.g. { [998] = true }. A uid, not a name:
-- it is what slurmctld authenticated (munge), and Lua has no name lookup.
local BRIDGE_UIDS = { }
-- Uids that only read (`gpu-bridge web`'s, `id -u gpu-bridge-web`): Slurm refuses every job
-- they submit or change, so the researchers' view can never act on Slurm, whatever runs as it.
local READ_ONLY_UIDS = { }
-- GraceTime of the preemptible partition, seconds; exported to jobs as GPU_BRIDGE_GRACE_S.
local GRACE_S = 120
-- The fast-grace tier (nil: none). Keep equal to gpu-bridge.yaml slurm.fast_partition and
-- slurm.fast_grace_s, and to the partition's GraceTime in slurm.conf.
local FAST_PARTITION = "preempt-fast"
local FAST_GRACE_S = 15
-- A job in the fast tier with --time at most this (minutes) need not declare saving on the
-- signal: losing it costs at most this much work.
local FAST_MAX_TIME_MIN = 60
-- slurm.conf's RequeueExit; exported to jobs as GPU_BRIDGE_REQUEUE_EXIT.
local REQUEUE_EXIT = 75                    -- bridge.wellknown.SLURM_REQUEUE_EXIT
-- ----------------------------------------------------------------------------------------

local NO_VAL16 = 65534
local NO_VAL = 4294967294
local INFINITE = 4294967295
local SAVE_TOKEN = "gpu-bridge:save-on-signal=" -- bridge.wellknown.SLURM_SIGNAL_SAVE_COMMENT

local function split_partitions(value)
   local out = {}
   if value ~= nil then
      for name in string.gmatch(value, "[^,]+") do
         out[#out + 1] = name
      end
   end
   return out
end

-- The partition(s) a submission will run in: the requested list, or the default partition.
local function requested_partitions(job_desc, part_list)
   local names = split_partitions(job_desc.partition)
   if #names == 0 and part_list ~= nil then
      for _, part in pairs(part_list) do
         if part.flag_default == 1 then
            names[1] = part.name
         end
      end
   end
   return names
end

local function contains(list, wanted)
   for _, v in ipairs(list) do
      if v == wanted then
         return true
      end
   end
   return false
end

local function is_bridge(uid)
   return uid == 0 or BRIDGE_UIDS[uid] == true
end



-- Seconds the comment's `gpu-bridge:save-on-signal=<s>` token declares (nil: none, or malformed:
-- a comment is user data). Tokens are separated by commas, semicolons or spaces.
local function declared_save_s(comment)
   if comment == nil then
      return nil
   end
   for tok in string.gmatch(comment, "[^%s,;]+") do
      if string.sub(tok, 1, #SAVE_TOKEN) == SAVE_TOKEN then
         local v = tonumber(string.sub(tok, #SAVE_TOKEN + 1))
         if v ~= nil and v >= 0 and v < math.huge then
            return v
         end
         return nil
      end
   end
   return nil
end

-- Why a job with this time limit (minutes; nil/NO_VAL: unset) and comment does not belong in
-- the fast tier, or nil when it does.
local function fast_tier_problem(time_limit, comment)
   local short = time_limit ~= nil and time_limit ~= NO_VAL and time_limit ~= INFINITE and
                 time_limit <= FAST_MAX_TIME_MIN
   if short then
      return nil
   end
   local save = declared_save_s(comment)
   if save ~= nil and save <= FAST_GRACE_S then
      return nil
   end
   local why
   if save ~= nil then
      why = "it declares saving in " .. tostring(save) .. " s, more than the tier's " ..
            tostring(FAST_GRACE_S) .. " s grace"
   else
      why = "it is neither short nor declares saving on the signal"
   end
   return "partition '" .. FAST_PARTITION .. "' is the fast-grace tier: its jobs get only " ..
          tostring(FAST_GRACE_S) .. " s between the preemption signal and SIGTERM, so a job " ..
          "there must be short (--time=" .. tostring(FAST_MAX_TIME_MIN) .. " or less) or " ..
          "checkpoint on the signal within that grace and say so " ..
          "(--comment=" .. SAVE_TOKEN .. "<seconds>, at most " .. tostring(FAST_GRACE_S) ..
          "); " .. why .. ". Otherwise submit with -p " .. PREEMPT_PARTITION ..
          " (see docs/researcher-guide.md, 'Which tier')"
end

local function reject(msg)
   slurm.log_user("gpu-bridge: " .. msg)
   slurm.log_info("job_submit/lua gpu-bridge: rejected: %s", msg)
   return slurm.ERROR
end

local function starts_with(s, prefix)
   return s ~= nil and string.sub(s, 1, #prefix) == prefix
end

-- The bridge's own partitions and job names, and what they are for.
local RESERVED = {
   { partition = HOLD_PARTITION, prefix = HOLD_JOB_PREFIX, what = "placeholder jobs (it holds nodes for serving)" },
   { partition = WARM_PARTITION, prefix = WARM_JOB_PREFIX,
     what = "memory holds (a sleeping vLLM replica's host memory, warm lending)" },
}

-- Why a job in partitions ``parts`` named ``name`` is not for anyone but the bridge, or nil.
local function reserved_problem(parts, name)
   for _, r in ipairs(RESERVED) do
      if contains(parts, r.partition) then
         return "partition '" .. r.partition .. "' is reserved for gpu-bridge's " .. r.what ..
                "; submit research jobs with -p " .. PREEMPT_PARTITION
      end
      if starts_with(name, r.prefix) then
         return "job names starting with '" .. r.prefix .. "' are reserved for gpu-bridge; choose another --job-name"
      end
   end
   return nil
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if READ_ONLY_UIDS[submit_uid] == true then
      return reject("uid " .. tostring(submit_uid) .. " is read-only (gpu-bridge web): it submits no jobs")
   end
   local parts = requested_partitions(job_desc, part_list)
   local bridge = is_bridge(submit_uid)

   local reserved = not bridge and reserved_problem(parts, job_desc.name)
   if reserved then
      return reject(reserved)
   end

   local fast = FAST_PARTITION ~= nil and contains(parts, FAST_PARTITION)
   if fast then
      local problem = fast_tier_problem(job_desc.time_limit, job_desc.comment)
      if problem ~= nil then
         return reject(problem)
      end
   end
   if contains(parts, PREEMPT_PARTITION) or fast then
      local part = fast and FAST_PARTITION or PREEMPT_PARTITION
      if job_desc.requeue == 0 then
         return reject("jobs in partition '" .. part .. "' must be requeueable: " ..
                       "its nodes are taken back for serving by preempting jobs with requeue, " ..
                       "and a --no-requeue job would be lost. Drop --no-requeue, checkpoint on " ..
                       "SIGUSR1/SIGTERM and resume when SLURM_RESTART_COUNT > 0 " ..
                       "(see slurm_conf/examples/)")
      end
      job_desc.requeue = 1
      if job_desc.script ~= nil then -- batch jobs only: srun/salloc carry no environment here
         -- a list naming both tiers: the shorter grace, the one the job may get
         job_desc.environment.GPU_BRIDGE_GRACE_S = tostring(fast and math.min(GRACE_S, FAST_GRACE_S) or GRACE_S)
         job_desc.environment.GPU_BRIDGE_REQUEUE_EXIT = tostring(REQUEUE_EXIT)
      end
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   if READ_ONLY_UIDS[modify_uid] == true then
      return reject("uid " .. tostring(modify_uid) .. " is read-only (gpu-bridge web): it changes no jobs")
   end
   local parts = split_partitions(job_desc.partition)
   if #parts == 0 then
      parts = split_partitions(job_rec.partition)
   end
   local bridge = is_bridge(modify_uid)

   local reserved = not bridge and reserved_problem(split_partitions(job_desc.partition), job_desc.name)
   if reserved then
      return reject(reserved)
   end
   for _, part in ipairs({ PREEMPT_PARTITION, FAST_PARTITION }) do
      if contains(parts, part) and job_desc.requeue == 0 then
         return reject("jobs in partition '" .. part .. "' must stay requeueable " ..
                       "(nodes are reclaimed by preempting jobs with requeue)")
      end
      -- Moving a job into a preemptible partition: job_rec does not expose the job's requeue
      -- flag (22.05 to 25.x), so the move itself must make the job requeueable. Without it a
      -- --no-requeue job would run on a lent node and be lost at the reclaim.
      local moving_in = contains(split_partitions(job_desc.partition), part) and
                        not contains(split_partitions(job_rec.partition), part)
      if moving_in and job_desc.requeue ~= 1 then
         return reject("a job moved into partition '" .. part .. "' must be requeueable: " ..
                       "set Requeue=1 in the same update (scontrol update JobId=N Partition=" ..
                       part .. " Requeue=1)")
      end
   end
   -- The fast tier: the job as it will be after the update (its new time limit and comment,
   -- or the ones it has) must still be short or save within the fast grace.
   if FAST_PARTITION ~= nil and contains(parts, FAST_PARTITION) then
      local time_limit = job_desc.time_limit
      if time_limit == nil or time_limit == NO_VAL then
         time_limit = job_rec.time_limit
      end
      local comment = job_desc.comment
      if comment == nil then
         comment = job_rec.comment
      end
      local problem = fast_tier_problem(time_limit, comment)
      if problem ~= nil then
         return reject(problem)
      end
   end
   return slurm.SUCCESS
end

slurm.log_info("job_submit/lua gpu-bridge: loaded (preempt=%s hold=%s warm=%s grace_s=%d fast=%s fast_grace_s=%d)",
               PREEMPT_PARTITION, HOLD_PARTITION, WARM_PARTITION, GRACE_S, tostring(FAST_PARTITION), FAST_GRACE_S)
return slurm.SUCCESS
