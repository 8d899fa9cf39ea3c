--[[
  Complete several active jobs of a batch worker in one call: upstream's moveToFinished runs here
  unchanged (embedded as a function), once per job, without fetching a next job, so each job is
  completed exactly as by a call of its own (lock checked, return value, 'completed' event,
  removeOnComplete, metrics, parent dependencies). A job upstream refuses (lock lost, not active)
  gets its error code; the others are completed all the same.

    KEYS[1..14] as upstream moveToFinished-14 for target "completed"; KEYS[12] (one job's key) is
                not used: each job's key is the key prefix and its id, as upstream builds it

    ARGV[1]     timestamp
    ARGV[2]     key prefix
    ARGV[3]     k: how many kinds of opts follow
    ARGV[4..3+k] opts as upstream's ARGV[8] (msgpack), without the token
    ARGV[4+k..] four per job: job id, return value (JSON), lock token, its kind of opts (1..k)

    Output: one reply per job: upstream moveToFinished's (0, or its negative error code)
]]

--- @function moveToFinished "<upstream>/moveToFinished-14"

local keys = {}
for i = 1, 14 do
  keys[i] = KEYS[i]
end
local kinds = tonumber(ARGV[3])
local opts = {}
for k = 1, kinds do
  opts[k] = cmsgpack.unpack(ARGV[3 + k])
end
local replies = {}
for i = 4 + kinds, #ARGV, 4 do
  local jobId = ARGV[i]
  local jobOpts = opts[tonumber(ARGV[i + 3])]
  jobOpts["token"] = ARGV[i + 2]
  keys[12] = ARGV[2] .. jobId
  replies[#replies + 1] = moveToFinished(keys,
    { jobId, ARGV[1], "returnvalue", ARGV[i + 1], "completed", "0", ARGV[2], cmsgpack.pack(jobOpts), "" })
end
return replies
