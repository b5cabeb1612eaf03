--[[
cli_filter.lua for gpu-bridge (the client-side cli_filter/lua plugin; CliFilterPlugins=cli_filter/lua).
Install next to slurm.conf on every submit host (it is read by sbatch/salloc/srun from the
directory of the slurm.conf they use). Tested on Slurm 22.05 by
tests/integration/test_job_submit_lua.py.

It gives every batch job of the preemptible partition a default pre-preemption signal:
  --signal=B:URG@<GRACE_S>
when the user gave no --signal, and every batch job of the fast-grace tier (FAST_PARTITION,
e.g. `preempt-fast`) --signal=B:URG@<FAST_GRACE_S> (a list naming both: the shorter grace).
With SlurmctldParameters=preempt_send_user_signal, Slurm sends
it to the batch shell as soon as the job is chosen for preemption (the start of GraceTime), so
a script that traps it can checkpoint. Without any --signal, a batch script gets nothing until
GraceTime is over and SIGTERM arrives (SIGKILL KillWait seconds later).

Why SIGURG and not SIGUSR1: the default action of SIGUSR1 is to terminate. A script that does
not trap it would die at the start of GraceTime, and a job that ends during GraceTime is not
requeued (Slurm 22.05 marks it FAILED): the job would be lost. SIGURG is ignored unless
trapped, so the default is harmless for scripts that know nothing of it. Scripts written for
gpu-bridge pass their own --signal=B:USR1@<s> (slurm_conf/examples/) or trap URG.

Why client-side: slurmctld's job_submit/lua cannot set a job's signal (warn_signal/warn_time
are not exposed to it). A user can bypass a client-side filter (another slurm.conf), so the
server-side rules (requeue, the hold partition) live in job_submit.lua.
--]]

-- Site settings (keep in step with job_submit.lua and slurm.conf) --------------------------
local PREEMPT_PARTITION = "preempt"
local PREEMPT_IS_DEFAULT = true -- Default=YES on the preemptible partition
local GRACE_S = 120             -- GraceTime of the preemptible partition
local SIGNAL = "URG"             -- ignored unless trapped: see above
local FAST_PARTITION = "preempt-fast" -- the fast-grace tier (nil: none)
local FAST_GRACE_S = 15         -- its GraceTime
-- -------------------------------------------------------------------------------------------

-- The grace a job submitted to `partition` (a list, or nil: the default) may get: the shortest
-- GraceTime among the preemptible partitions it names; nil when it names none.
local function grace_for(partition)
   if partition == nil or partition == "" then
      return PREEMPT_IS_DEFAULT and GRACE_S or nil
   end
   local grace = nil
   for name in string.gmatch(partition, "[^,]+") do
      local g = nil
      if name == PREEMPT_PARTITION then
         g = GRACE_S
      elseif FAST_PARTITION ~= nil and name == FAST_PARTITION then
         g = FAST_GRACE_S
      end
      if g ~= nil and (grace == nil or g < grace) then
         grace = g
      end
   end
   return grace
end

-- An unset --signal reads back as "0@0" (warn_signal 0) in 22.05.
local function has_signal(value)
   return value ~= nil and value ~= "" and string.match(value, "^0@") == nil
end

function slurm_cli_setup_defaults(options, early_pass)
   return slurm.SUCCESS
end

function slurm_cli_pre_submit(options, pack_offset)
   if options["type"] ~= nil and options["type"] ~= "sbatch" then
      return slurm.SUCCESS -- srun/salloc: B: (batch shell) signals only make sense for sbatch
   end
   local grace = grace_for(options["partition"])
   if grace ~= nil and not has_signal(options["signal"]) then
      options["signal"] = "B:" .. SIGNAL .. "@" .. tostring(grace)
   end
   return slurm.SUCCESS
end

function slurm_cli_post_submit(offset, job_id, step_id)
   return slurm.SUCCESS
end
