--[[
  Put back behind its gate a group job that a script which does not know the gate moved from a
  finished state to wait: Node's job.retry() and queue.retryJobs() (Bull-Board's Retry), that is
  upstream's reprocessJob and moveJobsToWait. The keeper calls it on the 'waiting' event such a
  retry emits (prev "failed" or "completed", no "gid": a gate's own releases carry one).

    KEYS[1..11] as updateGroups: wait, meta, active, marker, prioritized, pc, delayed, events,
                waiting-children, completed, failed
    KEYS[12]    paused

    ARGV[1] key prefix
    ARGV[2] job id
    ARGV[3] now (ms)

    Output: 1  held again, in its place in the group (released at once, as any held job, when the
               group has a free slot)
            2  a worker had taken it already: it is counted in its group's running set, so that
               no other job of the group is released beside it while it runs
            3  a worker had taken it already, and it has finished again
            0  nothing to do: not a job the gate held, already its group's (a released job, a held
               one), or gone
]]
local rcall = redis.call

--- @include "includes/groupGate"

local q = queueKeysFrom(KEYS)
local prefix = ARGV[1]
local jobId = ARGV[2]
local now = tonumber(ARGV[3])
local fields = rcall("HMGET", prefix .. jobId, "gid", "gseq", "timestamp", "gord", "delay", "priority", "opts",
  "finishedOn", "gpri")
local gid = fields[1]
if not gid or not fields[2] then
  return 0
end
if fields[8] then
  return 3
end
local runKey = prefix .. "grp:run:" .. gid
if rcall("SISMEMBER", runKey, jobId) == 1 or rcall("ZSCORE", q.waitingChildren, jobId) then
  return 0
end
if rcall("LREM", q.wait, 1, jobId) + rcall("LREM", KEYS[12], 1, jobId) + rcall("ZREM", q.prioritized, jobId) == 0 then
  if rcall("LPOS", q.active, jobId) then
    rcall("SADD", runKey, jobId)
    rcall("SADD", prefix .. "grp:index", gid)
    return 2
  end
  return 0
end
local maxEvents = getOrSetMaxEvents(q.meta)
local order = groupOrderScore(tonumber(fields[4]) or tonumber(fields[3]) or now, fields[9])
rcall("ZADD", prefix .. "grp:held:" .. gid, order, fields[2] .. jobId)
rcall("SADD", prefix .. "grp:index", gid)
reclaimForOrder(prefix, gid, order, q, maxEvents)
rcall("ZADD", q.waitingChildren, heldScore(fields[2], fields[5], fields[6], isLifo(fields[7])), jobId)
rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting-children", "jobId", jobId, "prev", "waiting")
releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
return 1
