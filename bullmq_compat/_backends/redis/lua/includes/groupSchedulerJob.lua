--[[
  Jobs made by upstream's job scheduler scripts (addJobScheduler, updateJobScheduler) from a
  template whose options hold a group (docs/groups.md, "Groups and job schedulers"). Upstream's
  script has stored and enqueued the job as for any scheduler (delayed until its time, or wait,
  or prioritized); gateSchedulerJob then takes it back from there and puts it through the group's
  gate as our addGroupJob puts a new group job: held behind the group's current jobs, released at
  once if the group has a free slot and nothing held ahead (to delayed while its upstream time
  still lies ahead: its hash keeps upstream's timestamp and delay).

  The same function adopts an iteration made by a Node worker (upstream's updateJobScheduler
  alone): a keeper calls it through gateSchedulerJobs. One a worker has taken already is made the
  group's current job (it holds a slot); a finished or gated one is left alone.
]]

--- @include "groupGate"

-- The group id in a job's stored options (cjson text), or nil.
local function storedGroupId(optsText)
  if not optsText or not string.find(optsText, '"group"', 1, true) then
    return nil, nil
  end
  local opts = cjson.decode(optsText)
  local group = opts["group"]
  local gid = type(group) == "table" and group["id"] or nil
  if type(gid) ~= "string" or gid == "" then
    return nil, nil
  end
  return gid, opts
end

-- Returns 1 when the job was gated (held or released), 2 when it was found active and given its
-- group's slot, 0 otherwise.
local function gateSchedulerJob(prefix, jobId, q, pausedKey, now, maxEvents)
  local jobKey = prefix .. jobId
  local f = rcall("HMGET", jobKey, "opts", "gid", "timestamp", "finishedOn")
  if not f[1] or f[2] or f[4] then
    return 0 -- gone, already one of the gate's, or finished
  end
  local gid, opts = storedGroupId(f[1])
  if not gid then
    return 0
  end
  local seq = string.format("%0" .. GROUP_SEQ_DIGITS .. "d", rcall("INCR", prefix .. "grp:seq"))
  local prev = nil -- where upstream's script put it
  if rcall("ZREM", q.delayed, jobId) == 1 then
    prev = "delayed"
  elseif rcall("ZREM", q.prioritized, jobId) == 1 then
    prev = "prioritized"
  elseif rcall("LREM", q.wait, 1, jobId) + rcall("LREM", pausedKey, 1, jobId) > 0 then
    prev = "waiting"
  end
  if not prev then
    if rcall("LPOS", q.active, jobId) then
      rcall("HSET", jobKey, "gid", gid, "gseq", seq)
      rcall("SADD", prefix .. "grp:run:" .. gid, jobId)
      rcall("SADD", prefix .. "grp:index", gid)
      return 2
    end
    return 0
  end
  holdNewGroupJob(prefix, gid, jobId, seq, tonumber(f[3]) or now, false, opts, q, maxEvents)
  releaseHeldGroupJobs(prefix, gid, q, now, maxEvents)
  if rcall("ZSCORE", q.waitingChildren, jobId) then
    rcall("XADD", q.events, "MAXLEN", "~", maxEvents, "*", "event", "waiting-children", "jobId", jobId,
      "prev", prev)
  end
  return 1
end
