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
            "rlimit"      ARGV[3] gid ("*" for the queue default), ARGV[4] "<max>:<duration ms>", or
                          "" to remove the setting (of the group: the queue's applies)
            "rlttl"       ARGV[3] gid: ms before the group may start another job by its rate
                          limits (0: now)
            "ratelimit"   ARGV[3] jobId, ARGV[4] "<ms>:<lock token>": the manual group rate limit
                          (worker.rate_limit_group): the active job's group starts nothing for ms;
                          the job (its lock checked, as upstream's moveJobFromActiveToWait checks it)
                          leaves active for the delayed set, due then, keeping its group's slot, and
                          the group's released jobs not started yet are delayed until then too.
                          Returns ms (the limit), or upstream's codes: -1 no job, -2 no lock, -6 not
                          its lock, -3 not active, -9 not a group job
            "delete"      ARGV[3] gid: remove the group's held jobs; returns how many
            "prune"       ARGV[3] gid: forget held entries whose job is no longer held (removed by
                          a script that does not know the gate, e.g. upstream's clean of
                          waiting-children); returns how many
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
  if ARGV[3] == "0" and rcall("EXISTS", prefix .. "grp:conc", prefix .. "grp:paused", prefix .. "grp:odelay",
      prefix .. "grp:rlim") > 0 then
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
elseif op == "rlimit" then
  flagGroupSettings(q, true)
  if ARGV[4] == "" then
    rcall("HDEL", prefix .. "grp:rlim", ARGV[3])
  else
    rcall("HSET", prefix .. "grp:rlim", ARGV[3], ARGV[4])
  end
  if ARGV[3] == "*" then
    return 0
  end
  return releaseHeldGroupJobs(prefix, ARGV[3], q, now, maxEvents) -- (a looser limit may let one go now)
elseif op == "rlttl" then
  local _, _, hasRates = queueReleaseState(q, true)
  local rate = groupRateState(prefix, ARGV[3], hasRates, now, nil)
  if not rate then
    return 0
  end
  local due = rateLimitedDue(rate, now)
  if not due then
    return rate.duration -- its released jobs not started yet fill the limit: at least a window
  end
  return due - now
elseif op == "ratelimit" then
  local jobId = ARGV[3]
  local ms, token = string.match(ARGV[4], "^(%d+):(.+)$")
  ms = tonumber(ms)
  if not ms or ms < 1 then
    return redis.error_reply("ratelimit needs <ms>:<token>, got " .. tostring(ARGV[4]))
  end
  local jobKey = prefix .. jobId
  local gid = rcall("HGET", jobKey, "gid")
  if not gid then
    return rcall("EXISTS", jobKey) == 1 and -9 or -1
  end
  local lockToken = rcall("GET", jobKey .. ":lock")
  if lockToken ~= token then
    return lockToken and -6 or -2
  end
  if rcall("LREM", q.active, 1, jobId) == 0 then
    return -3
  end
  rcall("DEL", jobKey .. ":lock")
  rcall("SREM", prefix .. "stalled", jobId)
  -- back to waiting its turn: not started (its next start is the one a rate limit counts)
  rcall("HDEL", jobKey, "processedOn")
  rcall("ZREM", prefix .. "grp:rlog:" .. gid, jobId)
  flagGroupSettings(q, true)
  local untilMs = now + ms
  local limitKey = prefix .. "grp:rlt:" .. gid
  if (tonumber(rcall("GET", limitKey)) or 0) < untilMs then
    rcall("SET", limitKey, untilMs, "PX", ms)
  end
  rcall("SADD", prefix .. "grp:run:" .. gid, jobId) -- (it keeps its slot; already there unless a sweep freed it)
  rcall("SADD", prefix .. "grp:index", gid)
  addDelayedJob(jobId, q.delayed, q.events, now, maxEvents, q.marker, ms)
  -- the group's other released jobs not started yet wait for the limit too (Node workers would take them)
  for _, id in ipairs(rcall("SMEMBERS", prefix .. "grp:run:" .. gid)) do
    if id ~= jobId and not rcall("HGET", prefix .. id, "processedOn") then
      local moved = rcall("LREM", q.wait, 1, id) == 1 or rcall("ZREM", q.prioritized, id) == 1
      if not moved then
        local score = tonumber(rcall("ZSCORE", q.delayed, id))
        moved = score ~= nil and math.floor(score / 0x1000) < untilMs
      end
      if moved then
        addDelayedJob(id, q.delayed, q.events, now, maxEvents, q.marker, ms)
      end
    end
  end
  return ms
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
elseif op == "prune" then
  local gid = ARGV[3]
  local heldKey = prefix .. "grp:held:" .. gid
  local pruned = pruneHeld(prefix, gid, q)
  if rcall("ZCARD", heldKey) == 0 and rcall("SCARD", prefix .. "grp:run:" .. gid) == 0
      and rcall("SISMEMBER", prefix .. "grp:paused", gid) == 0 then
    rcall("SREM", prefix .. "grp:index", gid)
  end
  return pruned
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
