--[[
  Change the group priority (BullMQ Pro's opts.group.priority) of a held group job: it moves within
  its group's held jobs (grp:held:<gid>, scored by groupOrderScore) and keeps its add sequence, so it
  goes after the held jobs of its new priority added before it and before those added after it. Its
  own priority (upstream's, used once it is released) is left as it is. A job released already (or
  not a group job) is left alone: the caller changes its own priority then, as upstream does.

    KEYS[1..11] as updateGroups: wait, meta, active, marker, prioritized, pc, delayed, events,
                waiting-children, completed, failed

    ARGV[1] key prefix
    ARGV[2] job id
    ARGV[3] the group priority, an integer from 0 to 2097151 (checked by the caller)
    ARGV[4] "1" for lifo

    Output: 1 moved; 0 not a held group job (nothing changed); -111 a priority >= 1 for a job with an
            order_ms; -112 lifo (a held job's place among equal priorities is its add order)
]]
local rcall = redis.call

--- @include "includes/groupGate"

local q = queueKeysFrom(KEYS)
local prefix = ARGV[1]
local jobId = ARGV[2]
local priority = tonumber(ARGV[3])
local jobKey = prefix .. jobId
local f = rcall("HMGET", jobKey, "gid", "gseq", "timestamp", "gord", "opts")
local gid, seq = f[1], f[2]
if not gid or not seq then
  return 0
end
local heldKey = prefix .. "grp:held:" .. gid
local member = seq .. jobId
if not rcall("ZSCORE", heldKey, member) or not rcall("ZSCORE", q.waitingChildren, jobId) then
  return 0
end
if ARGV[4] == "1" then
  return -112
end
if priority > 0 and f[4] then
  return -111
end
local opts = f[5] and cjson.decode(f[5]) or {}
if type(opts["group"]) ~= "table" then
  opts["group"] = { id = gid }
end
opts["group"]["priority"] = priority
rcall("HSET", jobKey, "opts", cjson.encode(opts))
if priority > 0 then
  rcall("HSET", jobKey, "gpri", priority)
else
  rcall("HDEL", jobKey, "gpri")
end
rcall("ZADD", heldKey, groupOrderScore(tonumber(f[4]) or tonumber(f[3]) or 0, priority), member)
return 1
