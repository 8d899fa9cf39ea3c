--[[
  Add a job to a group (bullmq-compat's per-group FIFO), storing it exactly as upstream does.

  The job is released at once (waiting, prioritized or delayed, as upstream's add scripts would)
  when its group has a free slot and nothing held ahead; otherwise it is held, and listed in
  upstream's waiting-children set so Bull-Board and getJobCounts show it as waiting. With an
  ordering delay, a job with an order_ms is released to delayed until order_ms + the delay, and
  a job with an earlier order_ms takes the group's not-yet-started delayed jobs back behind it.

  Deduplication (opts.de, ARGV[1][9] the key) decides exactly as upstream's add does (its
  deduplicateJob runs unchanged); for replace, a held job not yet due (its delay, or its ordering
  window, lies ahead) stands in upstream's delayed set for the call, where upstream's replace
  looks for a job it may replace, and a replaced group job leaves its group's bookkeeping.
  keepLastIfActive: a deduplicated add while the id's job (a group job) is active keeps the latest
  add in our own grp:dn:<id>, never upstream's dn:<id> (see createKeptGroupJob in groupGate);
  reschedule: a deduplicated add re-times a held job not yet due as upstream re-times a delayed one.

    KEYS[1..11] wait, meta, active, marker, prioritized, pc, delayed, events, waiting-children,
                completed, failed
    KEYS[12]    id (the job counter)

    ARGV[1] msgpacked args, as upstream's add scripts take them
            [1] key prefix, [2] custom id, [3] name, [4] timestamp, [5] parentKey, ...,
            [8] repeat job key
    ARGV[2] JSON job data
    ARGV[3] msgpacked options
    ARGV[4] group id
    ARGV[5] order score (order_ms, or the add timestamp)
    ARGV[6] now (ms)
    ARGV[7] "1" when ARGV[5] is a producer's order_ms, "0" when it is the add timestamp (absent,
            from older callers: an order_ms is one other than the timestamp)

    A flow child (args[5] parentKey, [6] the parent's dependencies key, [7] the parent link, [10]
    defer the parent's release: flow inserts) is linked to its parent exactly as upstream's add
    links one (the parent must exist, else -5; a custom id that exists is handled by upstream's
    handleDuplicatedJob), whether it is released or held: a held child is one of the parent's
    pending dependencies like any other, and upstream's finish of it moves the parent as usual.

    Output: jobId (a deduplicated add: the existing job's id); -5 when the flow parent is missing;
    -7 when a custom id that exists belongs to another parent; -110 when opts.group.priority is not
    an integer from 0 to 2097151, -111 when it is >= 1 and ARGV[5] is an order_ms (nothing is
    written, no id taken); -101 for a keepLastIfActive add whose deduplication id's
    job is an active job that is not a group job (nothing would create the kept job behind the gate);
    -102 when opts.group.maxSize is given and the group already holds that many jobs not started
    (groupIsFull): nothing is written, and no id is taken -- but for an add whose deduplication id
    names a job now, which is decided after upstream's deduplication (a deduplicated add is never
    refused; if this one is, the deduplication key it set is removed, and its id was taken)
]]
local rcall = redis.call
local q = nil

--- @include "<upstream>/includes/deduplicateJob"
--- @include "<upstream>/includes/handleDuplicatedJob"
--- @include "<upstream>/includes/storeJob"
--- @include "includes/groupGate"

q = queueKeysFrom(KEYS)
local args = cmsgpack.unpack(ARGV[1])
local opts = cmsgpack.unpack(ARGV[3])
local gid = ARGV[4]
local now = tonumber(ARGV[6])
local prefix = args[1]

-- a flow child: linked to its parent as upstream's add links one (see the top)
local parentKey = args[5]
local parentDependenciesKey = args[6]
local parentData = nil
if parentKey ~= nil then
  if rcall("EXISTS", parentKey) ~= 1 then
    return -5
  end
  parentData = cjson.encode(args[7])
end

-- group priority (opts.group.priority): an integer from 0 to GROUP_PRIORITY_LIMIT, and none >= 1 with
-- an order_ms (a prioritised job is ordered by its priority alone); refused before anything is written
do
  local group = opts["group"]
  local p = type(group) == "table" and group["priority"] or nil
  if p ~= nil then
    if type(p) ~= "number" or p < 0 or p > GROUP_PRIORITY_LIMIT or p ~= math.floor(p) then
      return -110
    end
    if p > 0 and (ARGV[7] == "1" or (ARGV[7] == nil and tonumber(ARGV[5]) ~= tonumber(args[4]))) then
      return -111
    end
  end
end

local deduplicationKey = args[9]
local deOpts = opts["de"]
local deid = deOpts and deOpts["id"]
-- keepLastIfActive: the active group job this add would be kept behind, if any
local keptBehind = nil
if deid and deduplicationKey and deOpts["keepLastIfActive"] then
  local current = rcall("GET", deduplicationKey)
  local pendingAfter = rcall("HGET", prefix .. "grp:dn:" .. deid, "after")
  if pendingAfter and (not current or current == pendingAfter) then
    local finished = rcall("HMGET", prefix .. pendingAfter, "finishedOn", "timestamp")
    if finished[1] or not finished[2] then
      -- its job has finished, not yet released: the kept job exists from now (as upstream's finish
      -- would have created it), and this add is deduplicated on it
      current = createKeptGroupJob(prefix, deid, pendingAfter, q, now, getOrSetMaxEvents(q.meta), nil)
    end
  end
  if current and rcall("LPOS", q.active, current) then
    if not rcall("HGET", prefix .. current, "gid") then
      return -101
    end
    keptBehind = current
  end
end

-- max group size: decided before anything is written, unless the add may be answered by an
-- existing job (a custom id that exists; a deduplication id that names a job: checked after
-- upstream's deduplication, below)
local maxSize = type(opts["group"]) == "table" and tonumber(opts["group"]["maxSize"]) or nil
local sizeAfterDedup = false
if maxSize and not keptBehind and not (args[2] ~= "" and rcall("EXISTS", prefix .. args[2]) == 1) then
  if deid and deduplicationKey and rcall("EXISTS", deduplicationKey) == 1 then
    sizeAfterDedup = true
  elseif groupIsFull(prefix, gid, q, maxSize) then
    return -102
  end
end

local jobCounter = rcall("INCR", KEYS[12])
local maxEvents = getOrSetMaxEvents(q.meta)
local timestamp = args[4]
local jobId = args[2]
if jobId == "" then
  jobId = jobCounter .. ""
elseif rcall("EXISTS", prefix .. jobId) == 1 then
  if parentKey ~= nil then
    return handleDuplicatedJob(prefix .. jobId, jobId, parentKey, args[7], parentData, parentDependenciesKey,
      q.completed, q.events, maxEvents, timestamp, args[10])
  end
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "duplicated", "jobId", jobId)
  return jobId
end
local jobKey = prefix .. jobId
local order = tonumber(ARGV[5])
local ordered = ARGV[7] == "1" or (ARGV[7] == nil and order ~= tonumber(timestamp))

-- keepLastIfActive, the id's job active: keep this add (the latest) behind it (see the top)
local function keepBehind(current)
  local seq = string.format("%0" .. GROUP_SEQ_DIGITS .. "d", rcall("INCR", prefix .. "grp:seq"))
  local dnKey = prefix .. "grp:dn:" .. deid
  rcall("DEL", dnKey)
  rcall("HSET", dnKey, "name", args[3], "data", ARGV[2], "opts", cjson.encode(opts), "jid", jobId, "gid", gid,
    "seq", seq, "order", ARGV[5], "ordered", ordered and "1" or "0", "after", current)
  if args[8] then
    rcall("HSET", dnKey, "rjk", args[8])
  end
  rcall("SET", prefix .. "grp:dna:" .. current, deid)
  rcall("PERSIST", deduplicationKey) -- as upstream: never expires while its job is active
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "deduplicated", "jobId", current,
    "deduplicationId", deid, "deduplicatedJobId", jobId)
  return current
end

-- reschedule: a deduplicated add re-times the held job `id` if it is not due yet (a delayed job's
-- analogue), as upstream re-times a delayed one: due `delay` from this add; applied at its release
local function rescheduleHeld(id)
  local f = heldJobFields(prefix, id)
  if not f[1] or not f[2] or not rcall("ZSCORE", prefix .. "grp:held:" .. f[1], f[2] .. id) then
    return
  end
  if heldJobDue(f, now) <= now then
    return
  end
  local delay = tonumber(opts["delay"]) or 0
  rcall("HSET", prefix .. id, "delay", delay, "gdue", tonumber(timestamp) + delay)
  rcall("ZADD", q.waitingChildren, "XX", tonumber(f[2]) + 0.5, id) -- its hash is read at release
end

-- replace mode: the group job the deduplication key names now, if any (see the top)
local function prepareReplace(deduplicationKey)
  local current = rcall("GET", deduplicationKey)
  if not current then
    return nil
  end
  local f = heldJobFields(prefix, current)
  if not f[1] or not f[2] then
    return nil -- not a group job: upstream's replace alone
  end
  local replaced = { id = current, gid = f[1], seq = f[2], standIn = false }
  if rcall("ZSCORE", prefix .. "grp:held:" .. f[1], f[2] .. current) then
    local due = heldJobDue(f, now)
    if f[7] then
      local _, hasSettings = queueReleaseState(q)
      local orderingDelay = groupOrderingDelay(prefix, f[1], hasSettings)
      if orderingDelay > 0 then
        due = math.max(due, tonumber(f[7]) + orderingDelay)
      end
    end
    if due > now then
      rcall("ZADD", q.delayed, due * 0x1000, current)
      replaced.standIn = true
    end
  end
  return replaced
end

-- after upstream's deduplication: a replaced group job leaves its group (whose next job may go)
local function afterReplace(replaced)
  if rcall("EXISTS", prefix .. replaced.id) == 1 then
    if replaced.standIn then
      rcall("ZREM", q.delayed, replaced.id)
    end
    return
  end
  rcall("ZREM", prefix .. "grp:held:" .. replaced.gid, replaced.seq .. replaced.id)
  rcall("ZREM", q.waitingChildren, replaced.id)
  rcall("SREM", prefix .. "grp:run:" .. replaced.gid, replaced.id)
  if replaced.gid ~= gid then
    releaseHeldGroupJobs(prefix, replaced.gid, q, now, maxEvents)
  end
end

if keptBehind then
  return keepBehind(keptBehind)
end
if deOpts and deduplicationKey then
  local replaced = nil
  if deOpts["replace"] then
    replaced = prepareReplace(deduplicationKey)
  end
  local deduplicatedJobId = deduplicateJob(deOpts, jobId, q.delayed, deduplicationKey, q.events, maxEvents,
    prefix, args[3], ARGV[2], opts, parentKey, parentData, parentDependenciesKey, args[8], timestamp)
  if replaced then
    afterReplace(replaced)
  end
  if deduplicatedJobId then
    if deOpts["reschedule"] and not deOpts["replace"] then
      rescheduleHeld(deduplicatedJobId)
    end
    return deduplicatedJobId
  end
end

if sizeAfterDedup and groupIsFull(prefix, gid, q, maxSize) then
  if rcall("GET", deduplicationKey) == jobId then
    rcall("DEL", deduplicationKey)
  end
  return -102
end

-- A custom id used before: the earlier job is gone (its hash is), but may still hold a slot of this
-- group if nobody released it yet (a Node worker finished it with removeOnComplete, keeper down).
-- Free that slot now: later, the id names this job, and the slot would never look finished. (A slot
-- it holds in another group looks finished to the next sweep, as this job's hash names its own group.)
if args[2] ~= "" then
  rcall("SREM", prefix .. "grp:run:" .. gid, jobId)
end

storeJob(q.events, jobKey, jobId, args[3], ARGV[2], opts, timestamp, parentKey, parentData, args[8])
local seq = string.format("%0" .. GROUP_SEQ_DIGITS .. "d", rcall("INCR", prefix .. "grp:seq"))
holdNewGroupJob(prefix, gid, jobId, seq, order, ordered, opts, q, maxEvents)

releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)

if rcall("ZSCORE", q.waitingChildren, jobId) then
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting-children", "jobId", jobId)
end
if parentDependenciesKey ~= nil then
  rcall("SADD", parentDependenciesKey, jobKey)
end
return jobId
