--[[
  The per-group gate of bullmq-compat (see the README's "Groups").

  Keys, all derived from the queue prefix (so a hash-tagged prefix keeps them in one slot):
    <prefix>grp:held:<gid>   zset of held jobs: score = order (order_ms or add time),
                             member = 15-digit add sequence .. jobId (ties keep add order)
    <prefix>grp:run:<gid>    set of the group's released jobs (at most its concurrency)
    <prefix>grp:index        set of groups with held or released jobs (swept periodically)
    <prefix>grp:conc         hash gid -> concurrency ("*" = the queue's default; else 1)
    <prefix>grp:paused       set of paused groups
    <prefix>grp:seq          add-sequence counter
    <prefix>grp:sweep        the keepers' sweep lease (written by GroupKeeper, PX the sweep interval)

  A group job's hash also has "gid", "gseq" (its 15-digit add sequence), so an entry left
  behind by a removed job is never taken for a later job that reuses its custom id, and "gord"
  (its order score, when order_ms gave one other than its timestamp), so a retried job goes back
  to its place in the group.

  A held job's score in upstream's waiting-children set is its add sequence (plus 0.5 when it has
  a delay, a priority or lifo): unique to it, so that releasing it takes it out of
  waiting-children by that score without reading its hash, and never takes a later job that
  reuses its id. (Bull-Board and Node list waiting-children by score: held jobs in add order.)
]]

--- @include "<upstream>/includes/addDelayedJob"
--- @include "<upstream>/includes/addJobInTargetList"
--- @include "<upstream>/includes/addJobWithPriority"
--- @include "<upstream>/includes/getOrSetMaxEvents"

local GROUP_SEQ_DIGITS = 15

-- A field of upstream's meta hash, "1" once any group of the queue has a setting (a concurrency,
-- a pause); written with the setting, and by sweeps for settings older than the flag.
local GROUP_SETTINGS_FLAG = "bullmq-compat:group-settings"

-- What releasing needs of the queue, in one read of its meta hash: is it paused or at its global
-- concurrency (the test of upstream's isQueuePausedOrMaxed, which decides whether a released job
-- adds the queue's marker), and has any of its groups a setting? markerSet: the caller knows the
-- marker is set (the queue is then taken as paused or maxed: released jobs add no marker).
local function queueReleaseState(q, markerSet)
  if markerSet then
    return true, rcall("HGET", q.meta, GROUP_SETTINGS_FLAG) ~= false
  end
  local meta = rcall("HMGET", q.meta, "paused", "concurrency", GROUP_SETTINGS_FLAG)
  local pausedOrMaxed = false
  if meta[1] then
    pausedOrMaxed = true
  elseif meta[2] then
    pausedOrMaxed = rcall("LLEN", q.active) >= tonumber(meta[2])
  end
  return pausedOrMaxed, meta[3] ~= false
end

-- A group's concurrency and whether it is paused. A queue none of whose groups has a setting (the
-- usual case) reads nothing more; none of its groups ever had more than one slot then (grp:conc
-- loses no field but by obliterate).
local function groupSettings(prefix, gid, hasSettings)
  if not hasSettings then
    return 1, false
  end
  local conc = rcall("HMGET", prefix .. "grp:conc", gid, "*")
  return tonumber(conc[1]) or tonumber(conc[2]) or 1, rcall("SISMEMBER", prefix .. "grp:paused", gid) == 1
end

-- Note that a group of the queue has a setting (see GROUP_SETTINGS_FLAG).
local function flagGroupSettings(q)
  rcall("HSET", q.meta, GROUP_SETTINGS_FLAG, "1")
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

-- A held job's score in waiting-children (see the top): its add sequence `seq` (text), plus 0.5
-- when releasing it needs more of its hash than its id (a delay, a priority, lifo).
local function heldScore(seq, delay, priority, lifo)
  local score = tonumber(seq)
  if (tonumber(delay) or 0) > 0 or (tonumber(priority) or 0) > 0 or lifo then
    return score + 0.5
  end
  return score
end

-- Is lifo set in a job's stored opts (upstream's cjson text: a plain search, without decoding)?
local function isLifo(opts)
  return opts ~= nil and opts ~= false and string.find(opts, '"lifo":true', 1, true) ~= nil
end

-- Take the popped held member `member` of group `gid` out of waiting-children. Returns true for
-- a job released as a plain job, its hash fields (heldJobFields) for one that needs them, or nil
-- for a job that is gone (removed meanwhile; its id may even name a newer job by now).
local function takeHeldJob(prefix, gid, member, q)
  local seqText = string.sub(member, 1, GROUP_SEQ_DIGITS)
  local seq = tonumber(seqText)
  local jobId = string.sub(member, GROUP_SEQ_DIGITS + 1)
  if seq then
    if rcall("ZREMRANGEBYSCORE", q.waitingChildren, seqText, seqText) == 1 then
      return true
    end
    if rcall("ZREMRANGEBYSCORE", q.waitingChildren, seq + 0.5, seq + 0.5) == 1 then
      return heldJobFields(prefix, jobId)
    end
  end
  -- not under its own score: removed, or held by an earlier version (scored by its timestamp)
  local fields = heldJobFields(prefix, jobId)
  if isOwnHeldJob(fields, gid, member) and rcall("ZREM", q.waitingChildren, jobId) == 1 then
    return fields
  end
  return nil
end

-- Enqueue a job that was held: exactly as upstream adds it (delayed, prioritized or waiting).
-- fields: as takeHeldJob returns them (true: a job with no delay, priority or lifo);
-- pausedOrMaxed: as queueReleaseState tells.
local function enqueueReleasedJob(jobId, gid, fields, q, now, maxEvents, pausedOrMaxed)
  if fields == true then
    addJobInTargetList(q.wait, q.marker, "LPUSH", pausedOrMaxed, jobId)
  else
    local timestamp = tonumber(fields[3]) or now
    local delay = tonumber(fields[4]) or 0
    local priority = tonumber(fields[5]) or 0
    if delay > 0 and timestamp + delay > now then
      addDelayedJob(jobId, q.delayed, q.events, timestamp, maxEvents or getOrSetMaxEvents(q.meta), q.marker, delay)
      return
    end
    if priority > 0 then
      addJobWithPriority(q.marker, q.prioritized, priority, jobId, q.pc, pausedOrMaxed)
    else
      addJobInTargetList(q.wait, q.marker, isLifo(fields[6]) and "RPUSH" or "LPUSH", pausedOrMaxed, jobId)
    end
  end
  -- "gid" beyond upstream's fields: a keeper following the stream learns the group of the job
  -- (it needs it once the job is finished, when its hash may be gone: removeOnComplete)
  if maxEvents then
    rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting", "jobId", jobId,
      "prev", "waiting-children", "gid", gid)
  else -- the caller trimmed the stream in this call (upstream's finish does, as its events need no MAXLEN)
    rcall("XADD", q.events, "*", "event", "waiting", "jobId", jobId, "prev", "waiting-children", "gid", gid)
  end
end

-- Release held jobs of a group while it has free slots; returns how many were released.
-- maxEvents nil: the caller has trimmed the events stream in this call (a job's finish), so the
-- events of released jobs are added without MAXLEN. slotFreed: the caller has just freed a slot of
-- the group (the finished job's). markerSet: the caller has set the queue's marker in this call
-- (upstream's fetch of a next job does), so released jobs need not set it again.
local function releaseHeldGroupJobs(prefix, gid, q, now, maxEvents, slotFreed, markerSet)
  local heldKey = prefix .. "grp:held:" .. gid
  local runKey = prefix .. "grp:run:" .. gid
  local released = 0
  local pausedOrMaxed, hasSettings = queueReleaseState(q, markerSet)
  local limit, paused = groupSettings(prefix, gid, hasSettings)
  local running = 0 -- one slot at most, ever, and it was just freed
  if hasSettings or not slotFreed then
    running = rcall("SCARD", runKey)
  end
  local mayHold = true -- false once the held set is seen empty
  if not paused then
    while running < limit do
      local first = rcall("ZPOPMIN", heldKey)[1]
      if not first then
        mayHold = false
        break
      end
      local jobId = string.sub(first, GROUP_SEQ_DIGITS + 1)
      -- a held job removed meanwhile (Bull-Board, Node job.remove()) has left waiting-children
      local fields = takeHeldJob(prefix, gid, first, q)
      if fields then
        enqueueReleasedJob(jobId, gid, fields, q, now, maxEvents, pausedOrMaxed)
        running = running + rcall("SADD", runKey, jobId)
        released = released + 1
      end
    end
  end
  -- a group with nothing running or held leaves the index (one that released a job is in use)
  if released == 0 and running == 0 and not (mayHold and rcall("ZCARD", heldKey) > 0) then
    rcall("SREM", prefix .. "grp:index", gid)
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
  local fields = rcall("HMGET", jobKey, "gid", "gseq", "timestamp", "gord", "delay", "priority", "opts")
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
  rcall("SADD", prefix .. "grp:index", gid)
  rcall("ZADD", q.waitingChildren, heldScore(fields[2], fields[5], fields[6], isLifo(fields[7])), jobId)
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting-children", "jobId", jobId,
    "prev", prevState)
  releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
  return 1
end

-- Free a released job's slot once it has left the running states; true when freed.
-- isMember: the caller read jobId from the group's running set.
local function freeGroupSlot(prefix, gid, jobId, q, isMember)
  local runKey = prefix .. "grp:run:" .. gid
  if not isMember and rcall("SISMEMBER", runKey, jobId) == 0 then
    return false
  end
  -- finished (completed or failed for good: upstream's finish sets finishedOn, a retry clears it),
  -- gone, or its id reused by a job that is not this group's
  local fields = rcall("HMGET", prefix .. jobId, "gid", "finishedOn")
  if fields[1] == gid and not fields[2] then
    return false -- retrying, backing off or stalled: still the group's current job
  end
  rcall("SREM", runKey, jobId)
  return true
end

local function queueKeysFrom(keys)
  return { wait = keys[1], meta = keys[2], active = keys[3], marker = keys[4], prioritized = keys[5],
    pc = keys[6], delayed = keys[7], events = keys[8], waitingChildren = keys[9], completed = keys[10],
    failed = keys[11] }
end
