--[[
  Upstream's addJobScheduler, unchanged, for a template whose options hold a group; then the job
  it made goes through the group's gate (includes/groupSchedulerJob), in the same call.

    KEYS[1..11] as upstream addJobScheduler-11 (repeat, delayed, wait, paused, meta, prioritized,
                marker, id, events, pc, active)
    KEYS[12]    waiting-children
    KEYS[13]    completed
    KEYS[14]    failed

    ARGV        as upstream addJobScheduler (ARGV[7] timestamp, ARGV[8] key prefix)

    Output: upstream addJobScheduler's ({jobId, delay}, or its error code)
]]
local rcall = redis.call

--- @function addJobScheduler "<upstream>/addJobScheduler-11"
--- @include "includes/groupSchedulerJob"

local result = addJobScheduler(KEYS, ARGV)
if type(result) == "table" then
  local q = { wait = KEYS[3], meta = KEYS[5], active = KEYS[11], marker = KEYS[7], prioritized = KEYS[6],
    pc = KEYS[10], delayed = KEYS[2], events = KEYS[9], waitingChildren = KEYS[12], completed = KEYS[13],
    failed = KEYS[14] }
  gateSchedulerJob(ARGV[8], result[1], q, KEYS[4], tonumber(ARGV[7]), getOrSetMaxEvents(KEYS[5]))
end
return result
