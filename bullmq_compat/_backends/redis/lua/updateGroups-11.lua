--[[
  Operations on bullmq-compat's group gates. Idempotent: any number of workers and keepers
  may call them for the same job.

    KEYS[1..11] wait, meta, active, marker, prioritized, pc, delayed, events, waiting-children,
                completed, failed

    ARGV[1] key prefix
    ARGV[2] operation:
            "release"     ARGV[3] jobId, ARGV[4] its gid: free its slot in that group if it has
                          finished (completed, failed for good or removed) and release the
                          group's next held jobs
            "sweep"       ARGV[3] cursor, ARGV[4] count: release for every group in a SSCAN
                          page of the group index; returns {next cursor, released}
            "pause"       ARGV[3] gid
            "resume"      ARGV[3] gid
            "concurrency" ARGV[3] gid ("*" for the queue default), ARGV[4] k
            "odelay"      ARGV[3] gid ("*" for the queue default), ARGV[4] the ordering delay in
                          ms, or "" to remove the setting (of the group: the queue's applies)
            "delete"      ARGV[3] gid: remove the group's held jobs; returns how many
            "retry"       ARGV[3] jobId, ARGV[4] "<failed|completed>:<reset atm 0|1><reset ats 0|1>":
                          put a finished group job back behind its gate (see regateFinishedJob)
    ARGV[5] now (ms)

    Output: number of jobs released (or removed, for "delete")
]]
local rcall = redis.call
local q = nil

--- @include "<upstream>/includes/removeJob"
--- @include "includes/groupGate"

q = queueKeysFrom(KEYS)
local prefix = ARGV[1]
local op = ARGV[2]
local now = tonumber(ARGV[5])
local maxEvents = getOrSetMaxEvents(q.meta)

-- Free the slots of the group's finished jobs; true when the group may have a slot to fill: one
-- was freed, none is taken, or the queue has group settings (a group may have more than one).
local function freeFinished(gid, hasSettings)
  local running = rcall("SMEMBERS", prefix .. "grp:run:" .. gid)
  local freed = false
  for _, jobId in ipairs(running) do
    freed = freeGroupSlot(prefix, gid, jobId, q, true, now, maxEvents) or freed
  end
  return freed or #running == 0 or hasSettings
end

if op == "release" then
  local jobId = ARGV[3]
  local gid = ARGV[4]
  if freeGroupSlot(prefix, gid, jobId, q, false, now, maxEvents) then
    return releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
  end
  return 0
elseif op == "sweep" then
  if ARGV[3] == "0" and rcall("EXISTS", prefix .. "grp:conc", prefix .. "grp:paused", prefix .. "grp:odelay") > 0 then
    flagGroupSettings(q) -- settings written before the flag was
  end
  local page = rcall("SSCAN", prefix .. "grp:index", ARGV[3], "COUNT", tonumber(ARGV[4]))
  local released = 0
  local _, hasSettings = queueReleaseState(q)
  for _, gid in ipairs(page[2]) do
    if freeFinished(gid, hasSettings) then -- (else its one slot is taken: nothing to release)
      released = released + releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
    end
  end
  return { page[1], released }
elseif op == "pause" then
  flagGroupSettings(q)
  rcall("SADD", prefix .. "grp:paused", ARGV[3])
  return 0
elseif op == "resume" then
  rcall("SREM", prefix .. "grp:paused", ARGV[3])
  return releaseHeldGroupJobs(prefix, ARGV[3], q, now, maxEvents)
elseif op == "concurrency" then
  flagGroupSettings(q)
  rcall("HSET", prefix .. "grp:conc", ARGV[3], ARGV[4])
  if ARGV[3] == "*" then
    return 0
  end
  return releaseHeldGroupJobs(prefix, ARGV[3], q, now, maxEvents)
elseif op == "odelay" then
  flagGroupSettings(q)
  if ARGV[4] == "" then
    rcall("HDEL", prefix .. "grp:odelay", ARGV[3])
  else
    rcall("HSET", prefix .. "grp:odelay", ARGV[3], ARGV[4])
  end
  return 0
elseif op == "delete" then
  local gid = ARGV[3]
  local heldKey = prefix .. "grp:held:" .. gid
  local removed = 0
  for _, member in ipairs(rcall("ZRANGE", heldKey, 0, -1)) do
    local jobId = string.sub(member, GROUP_SEQ_DIGITS + 1)
    -- (a removed job's id may name a newer job by now: not ours)
    if isOwnHeldJob(heldJobFields(prefix, jobId), gid, member) and rcall("ZREM", q.waitingChildren, jobId) == 1 then
      removeJob(jobId, true, prefix, true)
      rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "removed", "jobId", jobId,
        "prev", "waiting-children")
      removed = removed + 1
    end
  end
  rcall("DEL", heldKey)
  if rcall("SCARD", prefix .. "grp:run:" .. gid) == 0 then
    rcall("SREM", prefix .. "grp:index", gid)
  end
  return removed
elseif op == "retry" then
  local prevState, flags = string.match(ARGV[4], "^(%a+):(%d%d)$")
  if prevState ~= "failed" and prevState ~= "completed" then
    return redis.error_reply("retry needs <failed|completed>:<flags>, got " .. tostring(ARGV[4]))
  end
  if rcall("EXISTS", prefix .. ARGV[3]) == 0 then
    return -1
  end
  return regateFinishedJob(prefix, ARGV[3], prevState == "failed" and q.failed or q.completed, prevState,
    string.sub(flags, 1, 1) == "1", string.sub(flags, 2, 2) == "1", q, now, maxEvents)
end
return redis.error_reply("unknown group operation " .. tostring(op))
