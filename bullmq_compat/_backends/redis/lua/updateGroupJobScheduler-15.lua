--[[
  Upstream's updateJobScheduler, unchanged, for a scheduler job with a group taken by a
  bullmq-compat worker; then the next job it made goes through the group's gate
  (includes/groupSchedulerJob), in the same call: held while the group is busy (it is, with the
  job just taken, at concurrency 1).

    KEYS[1..12] as upstream updateJobScheduler-12 (repeat, delayed, wait, paused, meta,
                prioritized, marker, id, events, pc, producer job, active)
    KEYS[13]    waiting-children
    KEYS[14]    completed
    KEYS[15]    failed

    ARGV        as upstream updateJobScheduler (ARGV[5] timestamp, ARGV[6] key prefix)

    Output: upstream updateJobScheduler's (the next job's id, or nothing)
]]
local rcall = redis.call

--- @function updateJobScheduler "<upstream>/updateJobScheduler-12"
--- @include "includes/groupSchedulerJob"

local result = updateJobScheduler(KEYS, ARGV)
if type(result) == "string" then
  local q = { wait = KEYS[3], meta = KEYS[5], active = KEYS[12], marker = KEYS[7], prioritized = KEYS[6],
    pc = KEYS[10], delayed = KEYS[2], events = KEYS[9], waitingChildren = KEYS[13], completed = KEYS[14],
    failed = KEYS[15] }
  gateSchedulerJob(ARGV[6], result, q, KEYS[4], tonumber(ARGV[5]), getOrSetMaxEvents(KEYS[5]))
end
return result
