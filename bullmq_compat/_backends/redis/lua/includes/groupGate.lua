--[[
  The per-group gate of bullmq-compat (see the README's "Groups").

  Keys, all derived from the queue prefix (so a hash-tagged prefix keeps them in one slot):
    <prefix>grp:held:<gid>   zset of held jobs: score = order (order_ms or add time), or for a
                             job with a group priority p >= 1 (opts.group.priority) 2^42 + p,
                             after every order (groupOrderScore); member = 15-digit add
                             sequence .. jobId (ties keep add order: FIFO among equal priorities)
    <prefix>grp:run:<gid>    set of the group's released jobs (at most its concurrency)
    <prefix>grp:index        set of groups with held or released jobs (swept periodically)
    <prefix>grp:conc         hash gid -> concurrency ("*" = the queue's default; else 1)
    <prefix>grp:odelay       hash gid -> ordering delay in ms ("*" = the queue's default; else 0)
    <prefix>grp:paused       set of paused groups
    <prefix>grp:seq          add-sequence counter
    <prefix>grp:sweep        the keepers' sweep lease (written by GroupKeeper, PX the sweep interval)
    <prefix>grp:rlim         hash gid -> "<max>:<duration ms>", the group's rate limit ("*" = the
                             queue's default; else none)
    <prefix>grp:rlog:<gid>   zset of the group's recent starts (rate limit): member = jobId, score =
                             when it started (ms; processedOn, as upstream's moveToActive sets it)
    <prefix>grp:rlt:<gid>    the group's manual rate limit (rate_limit_group): until when (ms), PX

  A group job's hash also has "gid", "gseq" (its 15-digit add sequence), so an entry left
  behind by a removed job is never taken for a later job that reuses its custom id, and "gord"
  (its order_ms, when the producer gave one), so a retried job goes back to its place in the group
  and the ordering delay applies to it (a job without "gord" is due at once), and "gpri" (its group
  priority, when >= 1; a job with one has no "gord": the add refuses the two together).

  Ordering delay (grp:odelay): a held job with an order_ms is due once order_ms + the group's
  ordering delay has passed. A group's head released before it is due goes to upstream's delayed
  set, due then (upstream promotes it; Bull-Board shows it delayed); it holds its slot there, but
  a job with an earlier order score added meanwhile takes it back behind the gate (it never
  started) and goes first. Once promoted it is the group's current job like any other.

  A held job's score in upstream's waiting-children set is its add sequence (plus 0.5 when it has
  a delay, a priority or lifo): unique to it, so that releasing it takes it out of
  waiting-children by that score without reading its hash, and never takes a later job that
  reuses its id. (Bull-Board and Node list waiting-children by score: held jobs in add order.)
]]

--- @include "<upstream>/includes/addDelayedJob"
--- @include "<upstream>/includes/addJobInTargetList"
--- @include "<upstream>/includes/addJobWithPriority"
--- @include "<upstream>/includes/getOrSetMaxEvents"
--- @include "<upstream>/includes/storeJob"

local GROUP_SEQ_DIGITS = 15

-- Group priorities (BullMQ Pro's opts.group.priority): 0 (none) first, ordered by order; then
-- 1, 2, ..., GROUP_PRIORITY_LIMIT, each scored GROUP_PRIORITY_BASE + p, above every order (a ms
-- timestamp, an order_ms below 2^42: the clients refuse larger ones) and exact in a double.
local GROUP_PRIORITY_BASE = 0x40000000000 -- 2^42
local GROUP_PRIORITY_LIMIT = 2097151

-- A held job's score in grp:held:<gid>: its order, or GROUP_PRIORITY_BASE + its group priority.
local function groupOrderScore(order, gpri)
  local p = tonumber(gpri) or 0
  if p > 0 then
    return GROUP_PRIORITY_BASE + p
  end
  return order
end

-- The group priority of a job's options (0: none, or not a valid one).
local function groupPriorityOf(opts)
  local group = opts["group"]
  local p = type(group) == "table" and tonumber(group["priority"]) or nil
  if p and p >= 1 and p <= GROUP_PRIORITY_LIMIT and p == math.floor(p) then
    return p
  end
  return 0
end

-- A field of upstream's meta hash, "1" once any group of the queue has a setting (a concurrency,
-- a pause); written with the setting, and by sweeps for settings older than the flag.
local GROUP_SETTINGS_FLAG = "bullmq-compat:group-settings"
-- Another, "1" once any group of the queue has had a rate limit (set, or rate_limit_group's): only
-- then does a release read the group's rate limit.
local GROUP_RATE_FLAG = "bullmq-compat:group-rate-limits"

-- What releasing needs of the queue, in one read of its meta hash: is it paused or at its global
-- concurrency (the test of upstream's isQueuePausedOrMaxed, which decides whether a released job
-- adds the queue's marker), and has any of its groups a setting? markerSet: the caller knows the
-- marker is set (the queue is then taken as paused or maxed: released jobs add no marker).
-- (A third value: has any group of the queue had a rate limit? See GROUP_RATE_FLAG.)
local function queueReleaseState(q, markerSet)
  if markerSet then
    local flags = rcall("HMGET", q.meta, GROUP_SETTINGS_FLAG, GROUP_RATE_FLAG)
    return true, flags[1] ~= false, flags[2] ~= false
  end
  local meta = rcall("HMGET", q.meta, "paused", "concurrency", GROUP_SETTINGS_FLAG, GROUP_RATE_FLAG)
  local pausedOrMaxed = false
  if meta[1] then
    pausedOrMaxed = true
  elseif meta[2] then
    pausedOrMaxed = rcall("LLEN", q.active) >= tonumber(meta[2])
  end
  return pausedOrMaxed, meta[3] ~= false, meta[4] ~= false
end

-- A group's ordering delay (ms): its own setting, else the queue's ("*"), else 0.
local function groupOrderingDelay(prefix, gid, hasSettings)
  if not hasSettings then
    return 0
  end
  local delays = rcall("HMGET", prefix .. "grp:odelay", gid, "*")
  return tonumber(delays[1]) or tonumber(delays[2]) or 0
end

-- A group's concurrency, whether it is paused, and its ordering delay (ms). A queue none of whose
-- groups has a setting (the usual case) reads nothing more; none of its groups ever had more than
-- one slot or an ordering delay then (grp:conc and grp:odelay lose no field but by obliterate).
local function groupSettings(prefix, gid, hasSettings)
  if not hasSettings then
    return 1, false, 0
  end
  local conc = rcall("HMGET", prefix .. "grp:conc", gid, "*")
  return tonumber(conc[1]) or tonumber(conc[2]) or 1, rcall("SISMEMBER", prefix .. "grp:paused", gid) == 1,
    groupOrderingDelay(prefix, gid, true)
end

--[[
  Group rate limit (docs/groups.md, "Group rate limits"): at most `max` jobs of a group start in any
  window of `duration` ms. Starts happen in upstream's moveToActive (a Node worker's too), which we
  do not touch, so the gate decides when a job becomes available instead: a group's next job is
  released due at a time d such that the group's starts within (d - duration, d], plus its released
  jobs not started yet (each may start at any moment), plus itself, are at most `max`; a job due
  later goes to upstream's delayed set with that due time, as an ordering delay does. A start is
  processedOn; a finished job whose hash is gone counts as started when its slot is freed (later
  than it did: never faster than the limit). Jobs started before the group had a limit do not count.
  A manual limit (grp:rlt:<gid>) makes nothing of the group due before it ends.
]]
-- A group's rate limit: max and duration (nil, nil: none), and when its manual limit ends (ms; 0: none).
local function groupRateLimit(prefix, gid, hasSettings)
  if not hasSettings then
    return nil, nil, 0
  end
  local spec = rcall("HMGET", prefix .. "grp:rlim", gid, "*")
  local max, duration = nil, nil
  if spec[1] or spec[2] then
    local m, d = string.match(spec[1] or spec[2], "^(%d+):(%d+)$")
    max, duration = tonumber(m), tonumber(d)
  end
  return max, duration, tonumber(rcall("GET", prefix .. "grp:rlt:" .. gid)) or 0
end

-- The rate state of group `gid` (nil when it has no limit in force): its start log refreshed from its
-- released jobs (those started are logged; the others counted as unstarted), old starts trimmed.
-- freed: {jobId, startedAt} of a job whose slot the caller has just freed (logged first).
local function groupRateState(prefix, gid, hasSettings, now, freed)
  local max, duration, untilMs = groupRateLimit(prefix, gid, hasSettings)
  if not max then
    if untilMs > now then
      return { untilMs = untilMs }
    end
    return nil
  end
  local logKey = prefix .. "grp:rlog:" .. gid
  if freed then
    rcall("ZADD", logKey, "NX", freed[2], freed[1])
  end
  local unstarted = 0
  for _, id in ipairs(rcall("SMEMBERS", prefix .. "grp:run:" .. gid)) do
    local f = rcall("HMGET", prefix .. id, "gid", "processedOn")
    if f[1] ~= gid then
      rcall("ZADD", logKey, "NX", now, id) -- gone: its start is unknown, take the latest it can be
    elseif f[2] then
      rcall("ZADD", logKey, "NX", tonumber(f[2]), id)
    else
      unstarted = unstarted + 1
    end
  end
  rcall("ZREMRANGEBYSCORE", logKey, "-inf", now - duration)
  return { log = logKey, max = max, duration = duration, unstarted = unstarted, known = rcall("ZCARD", logKey),
    untilMs = untilMs }
end

-- When the group's next job may be due by its rate state (ms, >= now), or nil when none may be
-- released now (its released jobs not started yet fill the limit: the next finish or sweep looks again).
local function rateLimitedDue(rate, now)
  local due = now
  if rate.max then
    local allowed = rate.max - rate.unstarted - 1
    if allowed < 0 then
      return nil
    end
    if rate.known > allowed then
      local entry = rcall("ZRANGE", rate.log, rate.known - allowed - 1, rate.known - allowed - 1, "WITHSCORES")
      due = math.max(due, tonumber(entry[2]) + rate.duration)
    end
  end
  return math.max(due, rate.untilMs)
end

-- A slot of group `gid` freed outside a release (a keeper's, a sweep's): log the job's start if the
-- group has a rate limit (startedAt: its processedOn, nil when unknown: now).
local function noteFreedStart(prefix, gid, jobId, startedAt, q, now)
  local _, _, hasRates = queueReleaseState(q, true)
  if hasRates and groupRateLimit(prefix, gid, true) then
    rcall("ZADD", prefix .. "grp:rlog:" .. gid, "NX", tonumber(startedAt) or now, jobId)
  end
end

-- Note that a group of the queue has a setting (see GROUP_SETTINGS_FLAG); rates: a rate limit too.
local function flagGroupSettings(q, rates)
  if rates then
    rcall("HSET", q.meta, GROUP_SETTINGS_FLAG, "1", GROUP_RATE_FLAG, "1")
  else
    rcall("HSET", q.meta, GROUP_SETTINGS_FLAG, "1")
  end
end

-- The job hash fields the gate reads of a held job, in one HMGET: {gid, gseq, timestamp, delay,
-- priority, opts, gord, gdue}. "gdue": when a deduplicated add with reschedule re-timed the held job
-- (ms; else it is due at timestamp + delay).
local function heldJobFields(prefix, jobId)
  return rcall("HMGET", prefix .. jobId, "gid", "gseq", "timestamp", "delay", "priority", "opts", "gord", "gdue")
end

-- When a held job is due by its own delay (ms; 0: at once), fields as heldJobFields reads them.
local function heldJobDue(fields, now)
  if fields[8] then
    return tonumber(fields[8]) or 0
  end
  local delay = tonumber(fields[4]) or 0
  if delay > 0 then
    return (tonumber(fields[3]) or now) + delay
  end
  return 0
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
-- pausedOrMaxed: as queueReleaseState tells; orderDue: when the ordering delay makes it due (ms),
-- nil when it is due at once (then it is delayed only by its own delay, as upstream delays it).
local function enqueueReleasedJob(prefix, jobId, gid, fields, q, now, maxEvents, pausedOrMaxed, orderDue)
  local due = orderDue or 0
  if fields ~= true then
    due = math.max(due, heldJobDue(fields, now))
    if fields[8] then
      rcall("HDEL", prefix .. jobId, "gdue") -- applied: a later retry or regate goes by its delay
    end
  end
  if due > now then
    addDelayedJob(jobId, q.delayed, q.events, now, maxEvents or getOrSetMaxEvents(q.meta), q.marker, due - now)
    return
  end
  if fields == true then
    addJobInTargetList(q.wait, q.marker, "LPUSH", pausedOrMaxed, jobId)
  else
    local priority = tonumber(fields[5]) or 0
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
local function releaseHeldGroupJobs(prefix, gid, q, now, maxEvents, slotFreed, markerSet, freedStart)
  local heldKey = prefix .. "grp:held:" .. gid
  local runKey = prefix .. "grp:run:" .. gid
  local released = 0
  local pausedOrMaxed, hasSettings, hasRates = queueReleaseState(q, markerSet)
  local limit, paused, orderingDelay = groupSettings(prefix, gid, hasSettings)
  local running = 0 -- one slot at most, ever, and it was just freed
  if hasSettings or not slotFreed then
    running = rcall("SCARD", runKey)
  end
  local mayHold = true -- false once the held set is seen empty
  local rate = nil -- the group's rate limit state, when one is in force
  if hasRates then
    rate = groupRateState(prefix, gid, true, now, freedStart)
  end
  if not paused then
    while running < limit do
      local rateDue = nil
      if rate then
        rateDue = rateLimitedDue(rate, now)
        if not rateDue then
          break -- its released jobs not started yet fill the rate limit
        end
      end
      local popped = rcall("ZPOPMIN", heldKey)
      local first = popped[1]
      if not first then
        mayHold = false
        break
      end
      local jobId = string.sub(first, GROUP_SEQ_DIGITS + 1)
      -- a held job removed meanwhile (Bull-Board, Node job.remove()) has left waiting-children
      local fields = takeHeldJob(prefix, gid, first, q)
      if fields then
        local orderDue = nil
        if orderingDelay > 0 and tonumber(popped[2]) + orderingDelay > now then
          -- due later only if its order is a producer's order_ms ("gord"), not its add time
          local gord
          if fields == true then
            gord = rcall("HGET", prefix .. jobId, "gord")
          else
            gord = fields[7]
          end
          if gord then
            orderDue = tonumber(popped[2]) + orderingDelay
          end
        end
        if rateDue and rateDue > now then
          orderDue = math.max(orderDue or 0, rateDue)
        end
        enqueueReleasedJob(prefix, jobId, gid, fields, q, now, maxEvents, pausedOrMaxed, orderDue)
        running = running + rcall("SADD", runKey, jobId)
        released = released + 1
        if rate and rate.max then
          rate.unstarted = rate.unstarted + 1
        end
      end
    end
  end
  -- a group with nothing running or held leaves the index (one that released a job is in use)
  if released == 0 and running == 0 and not (mayHold and rcall("ZCARD", heldKey) > 0) then
    rcall("SREM", prefix .. "grp:index", gid)
  end
  return released
end

-- Take back behind the gate the group's released jobs that wait in upstream's delayed set without
-- having started, and come after `order` (the order score of a job just held): with an ordering
-- delay the head waits out its window there, and a late job with an earlier order goes first.
-- (Only jobs in the delayed set: one in wait may be fetched at any moment, and a job that started
-- once, say backing off from a retry, stays the group's current job.) Returns how many.
local function reclaimUnstartedGroupJobs(prefix, gid, order, q, maxEvents)
  local runKey = prefix .. "grp:run:" .. gid
  local reclaimed = 0
  for _, jobId in ipairs(rcall("SMEMBERS", runKey)) do
    if rcall("ZSCORE", q.delayed, jobId) then
      local f = rcall("HMGET", prefix .. jobId, "gid", "gseq", "timestamp", "gord", "processedOn", "delay",
        "priority", "opts", "gpri")
      local jobOrder = tonumber(f[4]) or tonumber(f[3])
      if jobOrder then
        jobOrder = groupOrderScore(jobOrder, f[9])
      end
      if f[1] == gid and f[2] and not f[5] and jobOrder and jobOrder > order then
        rcall("ZREM", q.delayed, jobId)
        rcall("SREM", runKey, jobId)
        rcall("ZADD", prefix .. "grp:held:" .. gid, jobOrder, f[2] .. jobId)
        rcall("ZADD", q.waitingChildren, heldScore(f[2], f[6], f[7], isLifo(f[8])), jobId)
        rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting-children", "jobId", jobId,
          "prev", "delayed")
        reclaimed = reclaimed + 1
      end
    end
  end
  return reclaimed
end

-- After holding a job of order score `order` in group `gid`: with an ordering delay, take back the
-- group's later jobs still waiting out their window (reclaimUnstartedGroupJobs).
local function reclaimForOrder(prefix, gid, order, q, maxEvents)
  local _, hasSettings = queueReleaseState(q)
  if groupOrderingDelay(prefix, gid, hasSettings) > 0 then
    reclaimUnstartedGroupJobs(prefix, gid, order, q, maxEvents)
  end
end

-- Hold a just-stored job of group `gid` behind its gate (add sequence `seq`, order score `order`;
-- `ordered`: the order is a producer's order_ms; opts.group.priority: its group priority, scored by
-- groupOrderScore): the caller releases the group after.
local function holdNewGroupJob(prefix, gid, jobId, seq, order, ordered, opts, q, maxEvents)
  local jobKey = prefix .. jobId
  if ordered then
    rcall("HSET", jobKey, "gid", gid, "gseq", seq, "gord", order)
  else
    rcall("HSET", jobKey, "gid", gid, "gseq", seq) -- ordered by its timestamp: no "gord" to read
  end
  local gpri = groupPriorityOf(opts)
  if gpri > 0 then
    rcall("HSET", jobKey, "gpri", gpri)
  end
  rcall("ZADD", prefix .. "grp:held:" .. gid, groupOrderScore(order, gpri), seq .. jobId)
  rcall("SADD", prefix .. "grp:index", gid)
  rcall("ZADD", q.waitingChildren, heldScore(seq, opts["delay"], opts["priority"], opts["lifo"]), jobId)
  if ordered then -- (a job ordered by its add time comes after the released ones, unless their order_ms lies ahead)
    reclaimForOrder(prefix, gid, order, q, maxEvents)
  end
end

--[[
  keepLastIfActive on group jobs (docs/groups.md, "Deduplication"). A deduplicated group add while
  the deduplication id's job is active keeps the latest add, as upstream does, but not in upstream's
  "dn:<id>" hash (upstream's finish, a Node worker's too, would add it straight to wait, past the
  gate): in our own
    <prefix>grp:dn:<dedup id>   hash: name, data, opts, jid (its job id), gid, seq (add sequence),
                                order, ordered ("1": order is an order_ms), rjk, after (the active
                                job's id)
    <prefix>grp:dna:<job id>    the dedup id kept behind that active (group) job
  Once that job has finished and its slot is freed (or a later add finds it finished first), the
  kept job is created, as upstream creates it (the id counter taken once more, the deduplication
  key set to it without a ttl), and held behind its group's gate in the place of its add.
]]
local function createKeptGroupJob(prefix, deid, after, q, now, maxEvents, releasedGid)
  local dnKey = prefix .. "grp:dn:" .. deid
  local p = rcall("HMGET", dnKey, "after", "name", "data", "opts", "jid", "gid", "seq", "order", "ordered", "rjk")
  rcall("DEL", prefix .. "grp:dna:" .. after)
  if p[1] ~= after then
    return nil -- kept behind a later job by now, or created already
  end
  rcall("DEL", dnKey)
  rcall("INCR", prefix .. "id") -- as upstream: the counter stays monotonic
  local jobId = p[5]
  if rcall("EXISTS", prefix .. jobId) == 1 then
    return nil -- its custom id was taken meanwhile
  end
  local me = maxEvents or getOrSetMaxEvents(q.meta)
  local opts = cjson.decode(p[4])
  rcall("SET", prefix .. "de:" .. deid, jobId)
  storeJob(q.events, prefix .. jobId, jobId, p[2], p[3], opts, now, nil, nil, p[10] or nil)
  local gid = p[6]
  holdNewGroupJob(prefix, gid, jobId, p[7], tonumber(p[8]), p[9] == "1", opts, q, me)
  rcall("XADD", q.events, "MAXLEN", "~", me, "*", "event", "waiting-children", "jobId", jobId)
  if gid ~= releasedGid then -- (the caller releases its own group)
    releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
  end
  return jobId
end

-- A slot of `jobId` was just freed: create the job kept behind it, if any (createKeptGroupJob).
local function createJobKeptBehind(prefix, jobId, q, now, maxEvents, releasedGid)
  local deid = rcall("GET", prefix .. "grp:dna:" .. jobId)
  if deid then
    createKeptGroupJob(prefix, deid, jobId, q, now, maxEvents, releasedGid)
  end
end

-- Put a finished group job (in the failed or completed set `stateKey`) back behind its group's
-- gate, as upstream's reprocessJob puts a job back to wait: finish fields cleared (and
-- attemptsMade / attemptsStarted when asked), then held in its place in the group and released
-- when the group has a free slot. Returns 1, 0 for a job the gate never held (no "gseq": let
-- upstream retry it), or -3 when the job is not in `stateKey`.
local function regateFinishedJob(prefix, jobId, stateKey, prevState, resetAtm, resetAts, q, now, maxEvents)
  local jobKey = prefix .. jobId
  local fields = rcall("HMGET", jobKey, "gid", "gseq", "timestamp", "gord", "delay", "priority", "opts", "gpri")
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
  local order = groupOrderScore(tonumber(fields[4]) or timestamp, fields[8])
  rcall("ZADD", prefix .. "grp:held:" .. gid, order, fields[2] .. jobId)
  rcall("SADD", prefix .. "grp:index", gid)
  reclaimForOrder(prefix, gid, order, q, maxEvents)
  rcall("ZADD", q.waitingChildren, heldScore(fields[2], fields[5], fields[6], isLifo(fields[7])), jobId)
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting-children", "jobId", jobId,
    "prev", prevState)
  releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
  return 1
end

-- Free a released job's slot once it has left the running states; true when freed (and the job a
-- keepLastIfActive add kept behind it created: the caller releases the group).
-- isMember: the caller read jobId from the group's running set.
local function freeGroupSlot(prefix, gid, jobId, q, isMember, now, maxEvents)
  local runKey = prefix .. "grp:run:" .. gid
  if not isMember and rcall("SISMEMBER", runKey, jobId) == 0 then
    return false
  end
  -- finished (completed or failed for good: upstream's finish sets finishedOn, a retry clears it),
  -- gone, or its id reused by a job that is not this group's
  local fields = rcall("HMGET", prefix .. jobId, "gid", "finishedOn", "processedOn")
  if fields[1] == gid and not fields[2] then
    return false -- retrying, backing off or stalled: still the group's current job
  end
  rcall("SREM", runKey, jobId)
  noteFreedStart(prefix, gid, jobId, fields[1] == gid and fields[3] or nil, q, now)
  createJobKeptBehind(prefix, jobId, q, now, maxEvents, gid)
  return true
end

--[[
  Max group size (BullMQ Pro's group.maxSize, docs/groups.md "Max group size"): a group's size is
  its jobs not started yet -- held behind the gate, and released ones not in the active list
  (waiting, prioritized, delayed; a retry's backoff too). Finished or removed released jobs (a slot
  not freed yet) do not count. Is the size of group `gid` at least `limit`? Cheap below the limit
  (two cardinalities); at it, the released jobs are looked at, and held entries whose job was
  removed by a script that does not know the gate (upstream's removeJob, clean) are forgotten first
  (as updateGroups' "prune"), so a removed held job frees its place at once.
]]
-- Forget the group's held entries whose job is no longer held (removed by a script that does not
-- know the gate: upstream's removeJob, clean); returns how many.
local function pruneHeld(prefix, gid, q)
  local heldKey = prefix .. "grp:held:" .. gid
  local pruned = 0
  for _, member in ipairs(rcall("ZRANGE", heldKey, 0, -1)) do
    local jobId = string.sub(member, GROUP_SEQ_DIGITS + 1)
    if not (isOwnHeldJob(heldJobFields(prefix, jobId), gid, member) and rcall("ZSCORE", q.waitingChildren, jobId)) then
      rcall("ZREM", heldKey, member)
      pruned = pruned + 1
    end
  end
  return pruned
end

local function groupIsFull(prefix, gid, q, limit)
  local heldKey = prefix .. "grp:held:" .. gid
  local runKey = prefix .. "grp:run:" .. gid
  local held = rcall("ZCARD", heldKey)
  if held + rcall("SCARD", runKey) < limit then
    return false
  end
  local pending = 0
  for _, id in ipairs(rcall("SMEMBERS", runKey)) do
    local f = rcall("HMGET", prefix .. id, "gid", "finishedOn")
    if f[1] == gid and not f[2] and not rcall("LPOS", q.active, id) then
      pending = pending + 1
    end
  end
  if held + pending < limit then
    return false
  end
  return held - pruneHeld(prefix, gid, q) + pending >= limit
end

local function queueKeysFrom(keys)
  return { wait = keys[1], meta = keys[2], active = keys[3], marker = keys[4], prioritized = keys[5],
    pc = keys[6], delayed = keys[7], events = keys[8], waitingChildren = keys[9], completed = keys[10],
    failed = keys[11] }
end
