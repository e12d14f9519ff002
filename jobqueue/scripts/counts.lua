--[[ counts: how many jobs of the shard are in each state, and whether it is paused.
KEYS[1] base      prefix  emq:{q}
KEYS[2] ring      LIST    lanes with ready work (pending = the sum of their sizes)
KEYS[3] schedule  ZSET
KEYS[4] active    ZSET
KEYS[5] dead      ZSET
KEYS[6] meta      HASH    paused, n_succeeded, n_cancelled (totals since the queue began)
KEYS[7] waiting   SET     jobs waiting for their dependencies
ARGV: none
Returns: {pending, scheduled, active, dead, succeeded, cancelled, paused (0/1), lanes, waiting}
]]
local base, ring, schedule, active, dead, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local lanes = redis.call('LRANGE', ring, 0, -1)
local pending = 0
for _, lane in ipairs(lanes) do pending = pending + redis.call('ZCARD', lane_key(base, lane)) end
local m = redis.call('HMGET', meta, 'n_succeeded', 'n_cancelled', 'paused')
return {pending, redis.call('ZCARD', schedule), redis.call('ZCARD', active),
  redis.call('ZCARD', dead), tonumber(m[1]) or 0, tonumber(m[2]) or 0,
  (m[3] == '1') and 1 or 0, #lanes, redis.call('SCARD', KEYS[7])}
