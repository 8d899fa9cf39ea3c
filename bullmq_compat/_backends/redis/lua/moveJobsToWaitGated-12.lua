--[[
  Retry finished jobs in bulk (queue.retry_jobs) as upstream's moveJobsToWait does, except that a
  group job goes back behind its group's gate instead of straight to wait, so a retry never runs
  two jobs of a group at once. Upstream's script runs unchanged on the jobs left.

    KEYS[1..8]  as upstream moveJobsToWait-8 (key prefix, events, state set, wait, paused, meta,
                active, marker)
    KEYS[9]     waiting-children
    KEYS[10]    prioritized
    KEYS[11]    priority counter
    KEYS[12]    delayed

    ARGV[1..3]  as upstream (count, timestamp, prev state: failed or completed)
    ARGV[4]     now (ms)

    Output: upstream moveJobsToWait's (1: more jobs may be left, 0: done)
]]
local rcall = redis.call

--- @function moveJobsToWait "<upstream>/moveJobsToWait-8"
--- @include "includes/groupGate"

local prefix = KEYS[1]
local maxCount = tonumber(ARGV[1])
local now = tonumber(ARGV[4])
local q = { wait = KEYS[4], meta = KEYS[6], active = KEYS[7], marker = KEYS[8], events = KEYS[2],
  waitingChildren = KEYS[9], prioritized = KEYS[10], pc = KEYS[11], delayed = KEYS[12] }
local maxEvents = getOrSetMaxEvents(q.meta)
local regated = 0
-- the jobs upstream would take: the group ones among them are regated first (regateFinishedJob
-- leaves the others alone), then upstream takes the rest (the same window, as the regated ones
-- have left the state set)
for _, jobId in ipairs(rcall("ZRANGEBYSCORE", KEYS[3], 0, tonumber(ARGV[2]), "LIMIT", 0, maxCount)) do
  if regateFinishedJob(prefix, jobId, KEYS[3], ARGV[3], false, false, q, now, maxEvents) == 1 then
    regated = regated + 1
  end
end
return moveJobsToWait(KEYS, { tostring(maxCount - regated), ARGV[2], ARGV[3] })
