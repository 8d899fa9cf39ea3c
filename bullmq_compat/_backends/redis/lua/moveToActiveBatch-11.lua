--[[
  Claim up to n jobs for a batch worker in one call: upstream's moveToActive runs here unchanged
  (embedded as a function by our resolver's `--- @function` line), once per lock token, so each job
  is claimed exactly as by a claim of its own (its lock, attemptsStarted, 'active' event, the rate
  limiter, delayed jobs promoted, pause and global concurrency honoured).

    KEYS[1..11] as upstream moveToActive-11

    ARGV[1]     key prefix
    ARGV[2]     timestamp
    ARGV[3]     opts as upstream's ARGV[3] (msgpack: lockDuration, limiter, name), without the token
    ARGV[4..]   one lock token per job wanted

    Output: upstream moveToActive's replies, in order, ending with the first that claimed no job
]]

--- @function moveToActive "<upstream>/moveToActive-11"

local opts = cmsgpack.unpack(ARGV[3])
local replies = {}
for i = 4, #ARGV do
  opts["token"] = ARGV[i]
  local reply = moveToActive(KEYS, { ARGV[1], ARGV[2], cmsgpack.pack(opts) })
  replies[#replies + 1] = reply
  if type(reply) ~= "table" or reply[1] == 0 then
    break
  end
end
return replies
