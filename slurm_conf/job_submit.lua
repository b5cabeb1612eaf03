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
    to the bridge: submissions there by anyone else are rejected (AllowGroups= in slurm.conf
    enforces it too; this gives the clear message). A researcher cannot fake a hold job,
    because gpu-bridge reads its holds by name. "The bridge" is the uid slurmctld
    authenticated for the request (submit_uid / modify_uid), never a user name the request
    carries.
  * Research jobs get the environment variable GPU_BRIDGE_GRACE_S (the preemptible
    partition's GraceTime), so a job script knows how long it has to checkpoint, and
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
-- Uids that may use the hold partition and hold job names (root always may): the uid the
-- gpu-bridge daemon runs as (`id -u gpu-bridge`), e.g. { [998] = true }. A uid, not a name:
-- it is what slurmctld authenticated (munge), and Lua has no name lookup.
local BRIDGE_UIDS = { }
-- Uids that only read (`gpu-bridge web`'s, `id -u gpu-bridge-web`): Slurm refuses every job
-- they submit or change, so the researchers' view can never act on Slurm, whatever runs as it.
local READ_ONLY_UIDS = { }
-- GraceTime of the preemptible partition, seconds; exported to jobs as GPU_BRIDGE_GRACE_S.
local GRACE_S = 120
-- slurm.conf's RequeueExit; exported to jobs as GPU_BRIDGE_REQUEUE_EXIT.
local REQUEUE_EXIT = 75                    -- bridge.wellknown.SLURM_REQUEUE_EXIT
-- ----------------------------------------------------------------------------------------

local NO_VAL16 = 65534

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



local function reject(msg)
   slurm.log_user("gpu-bridge: " .. msg)
   slurm.log_info("job_submit/lua gpu-bridge: rejected: %s", msg)
   return slurm.ERROR
end

local function starts_with(s, prefix)
   return s ~= nil and string.sub(s, 1, #prefix) == prefix
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if READ_ONLY_UIDS[submit_uid] == true then
      return reject("uid " .. tostring(submit_uid) .. " is read-only (gpu-bridge web): it submits no jobs")
   end
   local parts = requested_partitions(job_desc, part_list)
   local bridge = is_bridge(submit_uid)

   if contains(parts, HOLD_PARTITION) and not bridge then
      return reject("partition '" .. HOLD_PARTITION .. "' is reserved for gpu-bridge's placeholder jobs " ..
                    "(it holds nodes for serving); submit research jobs with -p " .. PREEMPT_PARTITION)
   end
   if starts_with(job_desc.name, HOLD_JOB_PREFIX) and not bridge then
      return reject("job names starting with '" .. HOLD_JOB_PREFIX .. "' are reserved for gpu-bridge; " ..
                    "choose another --job-name")
   end

   if contains(parts, PREEMPT_PARTITION) then
      if job_desc.requeue == 0 then
         return reject("jobs in partition '" .. PREEMPT_PARTITION .. "' must be requeueable: " ..
                       "its nodes are taken back for serving by preempting jobs with requeue, " ..
                       "and a --no-requeue job would be lost. Drop --no-requeue, checkpoint on " ..
                       "SIGUSR1/SIGTERM and resume when SLURM_RESTART_COUNT > 0 " ..
                       "(see slurm_conf/examples/)")
      end
      job_desc.requeue = 1
      if job_desc.script ~= nil then -- batch jobs only: srun/salloc carry no environment here
         job_desc.environment.GPU_BRIDGE_GRACE_S = tostring(GRACE_S)
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

   if contains(split_partitions(job_desc.partition), HOLD_PARTITION) and not bridge then
      return reject("partition '" .. HOLD_PARTITION .. "' is reserved for gpu-bridge's placeholder jobs")
   end
   if starts_with(job_desc.name, HOLD_JOB_PREFIX) and not bridge then
      return reject("job names starting with '" .. HOLD_JOB_PREFIX .. "' are reserved for gpu-bridge")
   end
   if contains(parts, PREEMPT_PARTITION) and job_desc.requeue == 0 then
      return reject("jobs in partition '" .. PREEMPT_PARTITION .. "' must stay requeueable " ..
                    "(nodes are reclaimed by preempting jobs with requeue)")
   end
   -- Moving a job into the preemptible partition: job_rec does not expose the job's requeue
   -- flag (22.05 to 25.x), so the move itself must make the job requeueable. Without it a
   -- --no-requeue job would run on a lent node and be lost at the reclaim.
   local moving_in = contains(split_partitions(job_desc.partition), PREEMPT_PARTITION) and
                     not contains(split_partitions(job_rec.partition), PREEMPT_PARTITION)
   if moving_in and job_desc.requeue ~= 1 then
      return reject("a job moved into partition '" .. PREEMPT_PARTITION .. "' must be requeueable: " ..
                    "set Requeue=1 in the same update (scontrol update JobId=N Partition=" ..
                    PREEMPT_PARTITION .. " Requeue=1)")
   end
   return slurm.SUCCESS
end

slurm.log_info("job_submit/lua gpu-bridge: loaded (preempt=%s hold=%s grace_s=%d)",
               PREEMPT_PARTITION, HOLD_PARTITION, GRACE_S)
return slurm.SUCCESS
