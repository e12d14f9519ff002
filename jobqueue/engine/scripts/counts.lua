--[[ counts: how many jobs of the shard are in each state, and whether it is paused.
KEYS[1] base      prefix  emq:{q}; reads lanes base:pending / base:lane:<l>
KEYS[2] ring      LIST    lanes with ready work (pending = the sum of their sizes, and of the
                          lanes held back by their cap or rate: base:capped, base:rated)
KEYS[3] schedule  ZSET
KEYS[4] active    ZSET
KEYS[5] dead      ZSET
KEYS[6] meta      HASH    paused, n_succeeded, n_cancelled, n_expired (totals since the queue began)
KEYS[7] waiting   SET     jobs waiting for their dependencies
ARGV: none
Returns: {pending, scheduled, active, dead, succeeded, cancelled, expired, paused (0/1), lanes
        on the ring, waiting}
]]
-- uses: lane_key
local base, ring, schedule, active, dead, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
  KEYS[6]
local lanes = redis.call('LRANGE', ring, 0, -1)
local seen, pending = {}, 0
local function add(names)
  for _, lane in ipairs(names) do
    if not seen[lane] then
      seen[lane] = true
      pending = pending + redis.call('ZCARD', lane_key(base, lane))
    end
  end
end
add(lanes)
add(redis.call('SMEMBERS', base .. ':capped'))
add(redis.call('ZRANGE', base .. ':rated', 0, -1))
local m = redis.call('HMGET', meta, 'n_succeeded', 'n_cancelled', 'n_expired', 'paused')
return {pending, redis.call('ZCARD', schedule), redis.call('ZCARD', active),
  redis.call('ZCARD', dead), tonumber(m[1]) or 0, tonumber(m[2]) or 0, tonumber(m[3]) or 0,
  (m[4] == '1') and 1 or 0, #lanes, redis.call('SCARD', KEYS[7])}
