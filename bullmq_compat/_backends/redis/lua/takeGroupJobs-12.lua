--[[
  Group affinity of a batch worker (see docs/worker.md, "Batches"): take the next held jobs of one
  group straight into active for the batch that holds the group's current job, in group order,
  each locked with a token of its own and prepared exactly as upstream's moveToActive prepares a
  job (upstream's prepareJobForProcessing: lock, processedOn, attemptsStarted, 'active' event).

  Each taken job is released first as the gate releases one ('waiting' event, from
  waiting-children, with its gid) and counted in the group's running set; the queue's
  group-settings flag is set, so that the releases that follow count the group's running jobs
  (SCARD) instead of taking the finished job's slot for the only one: nothing more of the group is
  released to anyone until the batch's jobs are down below the group's concurrency.

  Stops at: no held job left, the group or the queue paused (or at its global concurrency), the
  rate limit reached (the queue's, or the group's: a job it would make due later stays first in
  line), or a held job whose delay has not run out yet (it stays first in line).

    KEYS[1..11] as upstream moveToActive-11 (wait, active, prioritized, events, stalled, limiter,
                delayed, paused, meta, pc, marker)
    KEYS[12]    waiting-children

    ARGV[1]     key prefix
    ARGV[2]     timestamp
    ARGV[3]     opts as upstream moveToActive's ARGV[3] (msgpack: lockDuration, limiter, name),
                without the token
    ARGV[4]     the group id
    ARGV[5..]   one lock token per job wanted

    Output: a list with upstream moveToActive's reply for each job taken, in group order
]]
local rcall = redis.call

--- @include "includes/groupGate"
--- @include "<upstream>/includes/getQueueMetadata"
--- @include "<upstream>/includes/getRateLimitTTL"
--- @include "<upstream>/includes/prepareJobForProcessing"

local prefix = ARGV[1]
local now = tonumber(ARGV[2])
local opts = cmsgpack.unpack(ARGV[3])
local gid = ARGV[4]
local q = { wait = KEYS[1], active = KEYS[2], prioritized = KEYS[3], events = KEYS[4], delayed = KEYS[7],
  meta = KEYS[9], pc = KEYS[10], marker = KEYS[11], waitingChildren = KEYS[12] }

local pausedOrMaxed, rateLimitMax, rateLimitDuration = getQueueMetadata(KEYS[9], KEYS[2], KEYS[1])
if pausedOrMaxed then
  return {}
end
local _, groupPaused = groupSettings(prefix, gid, true)
if groupPaused then
  return {}
end
local maxJobs = tonumber(rateLimitMax or (opts['limiter'] and opts['limiter']['max']))
local limiterDuration = (opts['limiter'] and opts['limiter']['duration']) or rateLimitDuration
local heldKey = prefix .. "grp:held:" .. gid
local runKey = prefix .. "grp:run:" .. gid
local maxEvents = getOrSetMaxEvents(q.meta)
local _, _, hasRates = queueReleaseState(q, true)
local groupRate = groupRateState(prefix, gid, hasRates, now, nil)

local replies = {}
local i = 5
while i <= #ARGV do
  if getRateLimitTTL(maxJobs, KEYS[6]) > 0 then
    break
  end
  if groupRate then
    local due = rateLimitedDue(groupRate, now)
    if not due or due > now then
      break -- the group's rate limit: its next job is released (delayed) by the gate when its turn comes
    end
  end
  local popped = rcall("ZPOPMIN", heldKey)
  local member = popped[1]
  if not member then
    break
  end
  local jobId = string.sub(member, GROUP_SEQ_DIGITS + 1)
  local fields = takeHeldJob(prefix, gid, member, q)
  if fields then -- else removed meanwhile: try the next
    if fields ~= true then
      if heldJobDue(fields, now) > now then
        -- not due yet: back in its place, and the batch goes without the rest of the group
        rcall("ZADD", heldKey, popped[2], member)
        local score = fields[2] and heldScore(fields[2], fields[4], fields[5], isLifo(fields[6])) or popped[2]
        rcall("ZADD", q.waitingChildren, score, jobId)
        break
      end
    end
    flagGroupSettings(q)
    rcall("SADD", runKey, jobId)
    rcall("SADD", prefix .. "grp:index", gid)
    rcall("LPUSH", q.active, jobId)
    rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting", "jobId", jobId,
      "prev", "waiting-children", "gid", gid)
    opts["token"] = ARGV[i]
    if groupRate and groupRate.max then -- started now: logged, it counts for the next
      rcall("ZADD", groupRate.log, now, jobId)
      groupRate.known = groupRate.known + 1
    end
    replies[#replies + 1] = prepareJobForProcessing(prefix, KEYS[6], q.events, jobId, ARGV[2], maxJobs,
      limiterDuration, q.marker, opts)
    i = i + 1
  end
end
return replies
