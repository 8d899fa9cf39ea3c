--[[
  Test fixture: our own Lua composed with upstream includes through the <upstream> mapping.

    Input:
      KEYS[1] queue meta key
      KEYS[2] delayed zset key

    Output: { 1 if paused else 0, next delayed timestamp or false }
]]
local rcall = redis.call

-- getNextDelayedTimestamp is also included by addDelayMarkerIfNeeded: it must be emitted once.
--- @include "<upstream>/includes/getNextDelayedTimestamp"
--- @include "<upstream>/includes/addDelayMarkerIfNeeded"
--- @include "<upstream>/includes/isQueuePaused"

local paused = isQueuePaused(KEYS[1]) and 1 or 0
return { paused, getNextDelayedTimestamp(KEYS[2]) or false }
