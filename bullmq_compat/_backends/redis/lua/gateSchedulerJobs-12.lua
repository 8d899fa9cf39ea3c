--[[
  Put jobs made by upstream's job scheduler scripts alone (a Node worker's updateJobScheduler)
  through their group's gate: what a keeper calls for the "added" events of scheduler jobs, and
  its sweeps for each scheduler's next job (includes/groupSchedulerJob). Idempotent: a job gated
  already, finished, gone or without a group is left alone.

    KEYS[1..11] wait, meta, active, marker, prioritized, pc, delayed, events, waiting-children,
                completed, failed
    KEYS[12]    paused

    ARGV[1]     key prefix
    ARGV[2]     now (ms)
    ARGV[3..]   job ids

    Output: how many were gated or given a slot
]]
local rcall = redis.call
local q = nil

--- @include "includes/groupSchedulerJob"

q = queueKeysFrom(KEYS)
local maxEvents = getOrSetMaxEvents(q.meta)
local now = tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do
  if gateSchedulerJob(ARGV[1], ARGV[i], q, KEYS[12], now, maxEvents) > 0 then
    n = n + 1
  end
end
return n
