--[[
  The per-group gate of bullmq-compat (see the README's "Groups").

  Keys, all derived from the queue prefix (so a hash-tagged prefix keeps them in one slot):
    <prefix>grp:held:<gid>   zset of held jobs: score = order (order_ms or add time),
                             member = 15-digit add sequence .. jobId (ties keep add order)
    <prefix>grp:run:<gid>    set of the group's released jobs (at most its concurrency)
    <prefix>grp:index        set of groups with held or released jobs (swept periodically)
    <prefix>grp:conc         hash gid -> concurrency ("*" = the queue's default; else 1)
    <prefix>grp:paused       set of paused groups
    <prefix>grp:jobs         hash jobId -> gid, for jobs held or released
    <prefix>grp:seq          add-sequence counter
    <prefix>grp:sweep        the keepers' sweep lease (written by GroupKeeper, PX the sweep interval)

  A group job's hash also has "gid", "gseq" (its 15-digit add sequence), so an entry left
  behind by a removed job is never taken for a later job that reuses its custom id, and "gord"
  (its order score), so a retried job goes back to its place in the group.
]]

--- @include "<upstream>/includes/addDelayedJob"
--- @include "<upstream>/includes/addJobInTargetList"
--- @include "<upstream>/includes/addJobWithPriority"
--- @include "<upstream>/includes/getOrSetMaxEvents"
--- @include "<upstream>/includes/isQueuePausedOrMaxed"

local GROUP_SEQ_DIGITS = 15

local function groupConcurrency(prefix, gid)
  local conc = rcall("HMGET", prefix .. "grp:conc", gid, "*")
  return tonumber(conc[1]) or tonumber(conc[2]) or 1
end

-- The job hash fields the gate reads of a held job, in one HMGET: {gid, gseq, timestamp, delay,
-- priority, opts}.
local function heldJobFields(prefix, jobId)
  return rcall("HMGET", prefix .. jobId, "gid", "gseq", "timestamp", "delay", "priority", "opts")
end

-- Is the held-zset member `member` of group `gid` still the job its id names (fields as read by
-- heldJobFields)? A custom id may have been reused (by this or another group) after the held job
-- was removed.
local function isOwnHeldJob(fields, gid, member)
  return fields[1] == gid and (not fields[2] or fields[2] == string.sub(member, 1, GROUP_SEQ_DIGITS))
end

-- Enqueue a job that was held: exactly as upstream adds it (delayed, prioritized or waiting).
local function enqueueReleasedJob(jobId, fields, q, now, maxEvents, pausedOrMaxed)
  local timestamp = tonumber(fields[3]) or now
  local delay = tonumber(fields[4]) or 0
  local priority = tonumber(fields[5]) or 0
  if delay > 0 and timestamp + delay > now then
    addDelayedJob(jobId, q.delayed, q.events, timestamp, maxEvents, q.marker, delay)
    return pausedOrMaxed
  end
  if pausedOrMaxed == nil then
    pausedOrMaxed = isQueuePausedOrMaxed(q.meta, q.active)
  end
  if priority > 0 then
    addJobWithPriority(q.marker, q.prioritized, priority, jobId, q.pc, pausedOrMaxed)
  else
    -- the stored opts are upstream's cjson text: a plain search finds lifo without decoding it all
    local lifo = fields[6] and string.find(fields[6], '"lifo":true', 1, true)
    addJobInTargetList(q.wait, q.marker, lifo and "RPUSH" or "LPUSH", pausedOrMaxed, jobId)
  end
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting", "jobId", jobId,
    "prev", "waiting-children")
  return pausedOrMaxed
end

-- Release held jobs of a group while it has free slots; returns how many were released.
-- maxEvents may be nil: it is then read only if a job is released.
local function releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
  local heldKey = prefix .. "grp:held:" .. gid
  local runKey = prefix .. "grp:run:" .. gid
  local released = 0
  if rcall("SISMEMBER", prefix .. "grp:paused", gid) == 0 then
    local limit = groupConcurrency(prefix, gid)
    local pausedOrMaxed = nil
    local running = rcall("SCARD", runKey)
    while running < limit do
      local first = rcall("ZPOPMIN", heldKey)[1]
      if not first then
        break
      end
      local jobId = string.sub(first, GROUP_SEQ_DIGITS + 1)
      -- a held job removed meanwhile (Bull-Board, Node job.remove()) has left waiting-children;
      -- its id may even name a newer job by now, whose bookkeeping is left alone
      local fields = heldJobFields(prefix, jobId)
      local own = isOwnHeldJob(fields, gid, first)
      if own and rcall("ZREM", q.waitingChildren, jobId) == 1 then
        maxEvents = maxEvents or getOrSetMaxEvents(q.meta)
        pausedOrMaxed = enqueueReleasedJob(jobId, fields, q, now, maxEvents, pausedOrMaxed)
        running = running + rcall("SADD", runKey, jobId)
        released = released + 1
      elseif own or not fields[1] then
        rcall("HDEL", prefix .. "grp:jobs", jobId)
      end
    end
  end
  if released == 0 and rcall("SCARD", runKey) == 0 and rcall("ZCARD", heldKey) == 0 then
    rcall("SREM", prefix .. "grp:index", gid)  -- (a group that released a job is still in use)
  end
  return released
end

-- Put a finished group job (in the failed or completed set `stateKey`) back behind its group's
-- gate, as upstream's reprocessJob puts a job back to wait: finish fields cleared (and
-- attemptsMade / attemptsStarted when asked), then held in its place in the group and released
-- when the group has a free slot. Returns 1, 0 for a job the gate never held (no "gseq": let
-- upstream retry it), or -3 when the job is not in `stateKey`.
local function regateFinishedJob(prefix, jobId, stateKey, prevState, resetAtm, resetAts, q, now, maxEvents)
  local jobKey = prefix .. jobId
  local fields = rcall("HMGET", jobKey, "gid", "gseq", "timestamp", "gord")
  local gid = fields[1]
  if not gid or not fields[2] then
    return 0
  end
  if rcall("ZREM", stateKey, jobId) == 0 then
    return -3
  end
  local toRemove = { "finishedOn", "processedOn", prevState == "failed" and "failedReason" or "returnvalue" }
  if resetAtm then
    toRemove[#toRemove + 1] = "atm"
  end
  if resetAts then
    toRemove[#toRemove + 1] = "ats"
  end
  rcall("HDEL", jobKey, unpack(toRemove))
  -- its slot is free by now (finished); a slot nobody released yet must not hold the job up
  rcall("SREM", prefix .. "grp:run:" .. gid, jobId)
  local timestamp = tonumber(fields[3]) or now
  rcall("ZADD", prefix .. "grp:held:" .. gid, tonumber(fields[4]) or timestamp, fields[2] .. jobId)
  rcall("HSET", prefix .. "grp:jobs", jobId, gid)
  rcall("SADD", prefix .. "grp:index", gid)
  rcall("ZADD", q.waitingChildren, timestamp, jobId)
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting-children", "jobId", jobId,
    "prev", prevState)
  releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
  return 1
end

-- Free a released job's slot once it has left the running states; true when freed.
local function freeGroupSlot(prefix, gid, jobId, q)
  local runKey = prefix .. "grp:run:" .. gid
  if rcall("SISMEMBER", runKey, jobId) == 0 then
    return false
  end
  -- gone, or its id reused by a job that is not this group's
  local finished = rcall("ZSCORE", q.completed, jobId)
    or rcall("HGET", prefix .. jobId, "gid") ~= gid
    or rcall("ZSCORE", q.failed, jobId)
  if not finished then
    return false -- retrying, backing off or stalled: still the group's current job
  end
  rcall("SREM", runKey, jobId)
  rcall("HDEL", prefix .. "grp:jobs", jobId)
  return true
end

local function queueKeysFrom(keys)
  return { wait = keys[1], meta = keys[2], active = keys[3], marker = keys[4], prioritized = keys[5],
    pc = keys[6], delayed = keys[7], events = keys[8], waitingChildren = keys[9], completed = keys[10],
    failed = keys[11] }
end
