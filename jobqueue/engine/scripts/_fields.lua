--[[ _fields: the server clock, and the checks a script reads a row's fields through. Any field
of a row may be corrupt (hand-edited, bit-rotted): scripts read the fields they rely on through
these checks and bury a row that fails them (bury, _finish.lua), instead of raising mid-script
(a script error keeps its earlier writes, so it could strand jobs it had already popped).
Touches no key.
]]

-- Milliseconds on the server clock: leases and schedules never trust a worker's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The states a row may hold (a popped row in none of them is buried).
local STATES = {pending = true, scheduled = true, active = true, succeeded = true, dead = true,
  cancelled = true, expired = true, waiting = true}

-- A non-negative integer field (at most 15 digits: exact as a Lua number), or nil.
local function count_field(v)
  if v and #v <= 15 and string.find(v, '^%d+$') then return tonumber(v) end
  return nil
end

-- A row's `lease_ms`: '<lease ms>', or '<lease ms>:<timeout ms>' for a job with a run time limit
-- (kept in the one field so a claim reads no field more): lease, timeout (0: none); nil when
-- corrupt.
-- uses: count_field
local function lease_field(v)
  local lease, limit = string.match(v, '^(%d+):(%d+)$')
  if not lease then return count_field(v), 0 end
  limit = count_field(limit)
  return limit and count_field(lease), limit
end

local function valid_lane(lane)
  return lane == '' or (#lane <= 128 and not string.find(lane, '[^%w%._:%-]'))
end

local function valid_priority(v)
  local p = v and string.find(v, '^%-?%d%d?%d?$') and tonumber(v)
  return p and p >= -100 and p <= 100
end
