--[[
  Finish a group job exactly as upstream's moveToFinished does (it runs here unchanged), then,
  if it finished, free its group slot (creating the job a keepLastIfActive add kept behind it) and
  release the group's next held job: one call where a plain job takes one, instead of a second
  script call per job.

  A job that did not finish (the upstream script returned an error code: lock lost, not active,
  pending children) keeps its slot. Retries, backoffs and stalls never come here.

    KEYS[1..14] as upstream moveToFinished-14 (wait, active, prioritized, events, stalled, limiter,
                delayed, paused, meta, pc, completed/failed, job, metrics, marker)
    KEYS[15]    waiting-children

    ARGV[1..9]  as upstream moveToFinished (ARGV[1] jobId, ARGV[2] timestamp, ARGV[7] key prefix)
    ARGV[10]    the job's group id

    Output: upstream moveToFinished's
]]
local rcall = redis.call

--- @function moveToFinished "<upstream>/moveToFinished-14"
--- @include "includes/groupGate"

-- its start, for its group's rate limit (read first: the finish may remove the hash, removeOnComplete)
local startedAt = rcall("HGET", KEYS[12], "processedOn")
local result = moveToFinished(KEYS, ARGV)
if type(result) == "table" or result >= 0 then
  local prefix = ARGV[7]
  local gid = ARGV[10]
  local jobId = ARGV[1]
  if rcall("SREM", prefix .. "grp:run:" .. gid, jobId) == 1 then
    local q = { wait = KEYS[1], active = KEYS[2], prioritized = KEYS[3], events = KEYS[4],
      delayed = KEYS[7], meta = KEYS[9], pc = KEYS[10], marker = KEYS[14], waitingChildren = KEYS[15] }
    local now = tonumber(ARGV[2])
    createJobKeptBehind(prefix, jobId, q, now, nil, gid) -- (keepLastIfActive: see groupGate)
    -- a fetched next job (upstream returns its id second) has set the queue's marker in this call
    releaseHeldGroupJobs(prefix, gid, q, now, nil, true, type(result) == "table" and result[2] ~= 0,
      { jobId, tonumber(startedAt) or now })
  end
end
return result
