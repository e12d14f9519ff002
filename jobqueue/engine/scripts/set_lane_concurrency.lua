--[[ set_lane_concurrency (operator): set one lane's cap live on this shard, or drop it (back to
the settings' cap). Lanes held at their cap come back on the ring, so a raised cap serves them
at once; the claim holds back again those still at (a lowered) cap, one turn each.
KEYS[1] base    prefix  emq:{q}; reads lanes base:pending / base:lane:<l>, base:rated (a
                        lane back from its cap, unless rated); base:capped SET lanes held off
                        the ring at their cap
KEYS[2] caps    HASH    lane ('*': every named lane) -> cap set live
KEYS[3] meta    HASH    caps = '1' while `caps` holds any (claims read it, enqueues hand no job
                        over)
KEYS[4] ring    LIST    lanes with ready work
KEYS[5] wake    LIST    wake tokens
ARGV[1] lane       '' = the default lane, '*' = every named lane
ARGV[2] cap        0 = drop the live cap
Returns: how many held lanes came back on the ring
]]
-- uses: lane_back, wake_workers
local base, caps, meta, ring, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local capped = base .. ':capped'
local lane, cap = ARGV[1], tonumber(ARGV[2])
if cap > 0 then redis.call('HSET', caps, lane, cap) else redis.call('HDEL', caps, lane) end
if redis.call('HLEN', caps) > 0 then
  redis.call('HSET', meta, 'caps', '1')
else
  redis.call('HDEL', meta, 'caps')
end
local lanes = (lane == '*') and redis.call('SMEMBERS', capped) or {lane}
local back = 0
for _, name in ipairs(lanes) do
  if redis.call('SREM', capped, name) == 1 then back = back + lane_back(base, ring, name) end
end
wake_workers(wake, back)
return back
