--[[
  Add a job to a group (bullmq-compat's per-group FIFO), storing it exactly as upstream does.

  The job is released at once (waiting, prioritized or delayed, as upstream's add scripts would)
  when its group has a free slot and nothing held ahead; otherwise it is held, and listed in
  upstream's waiting-children set so Bull-Board and getJobCounts show it as waiting.

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

    Output: jobId; -100 when the job has a flow parent (group jobs cannot be flow children)
]]
local rcall = redis.call
local q = nil

--- @include "<upstream>/includes/storeJob"
--- @include "includes/groupGate"

q = queueKeysFrom(KEYS)
local args = cmsgpack.unpack(ARGV[1])
local opts = cmsgpack.unpack(ARGV[3])
local gid = ARGV[4]
local now = tonumber(ARGV[6])
local prefix = args[1]

if args[5] ~= nil then
  return -100
end

local jobCounter = rcall("INCR", KEYS[12])
local maxEvents = getOrSetMaxEvents(q.meta)
local timestamp = args[4]
local jobId = args[2]
if jobId == "" then
  jobId = jobCounter .. ""
elseif rcall("EXISTS", prefix .. jobId) == 1 then
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "duplicated", "jobId", jobId)
  return jobId
end
local jobKey = prefix .. jobId

-- A custom id used before: the earlier job is gone (its hash is), but may still hold a slot of this
-- group if nobody released it yet (a Node worker finished it with removeOnComplete, keeper down).
-- Free that slot now: later, the id names this job, and the slot would never look finished. (A slot
-- it holds in another group looks finished to the next sweep, as this job's hash names its own group.)
if args[2] ~= "" then
  rcall("SREM", prefix .. "grp:run:" .. gid, jobId)
end

storeJob(q.events, jobKey, jobId, args[3], ARGV[2], opts, timestamp, nil, nil, args[8])
local seq = string.format("%0" .. GROUP_SEQ_DIGITS .. "d", rcall("INCR", prefix .. "grp:seq"))
if tonumber(ARGV[5]) == tonumber(timestamp) then
  rcall("HSET", jobKey, "gid", gid, "gseq", seq) -- ordered by its timestamp: no "gord" to read
else
  rcall("HSET", jobKey, "gid", gid, "gseq", seq, "gord", ARGV[5])
end

rcall("ZADD", prefix .. "grp:held:" .. gid, tonumber(ARGV[5]), seq .. jobId)
rcall("SADD", prefix .. "grp:index", gid)
rcall("ZADD", q.waitingChildren, heldScore(seq, opts["delay"], opts["priority"], opts["lifo"]), jobId)

releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)

if rcall("ZSCORE", q.waitingChildren, jobId) then
  rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting-children", "jobId", jobId)
end
return jobId
