--[[ heads (read-only; the console and the oldest-wait figure): the first job of each priority
band of each lane, and when it became ready. A lane is served in order, highest priority first
and FIFO within one, so whatever waits longest waits at the head of a band.
KEYS[1] base    prefix  emq:{q}
KEYS[2] ring    LIST    lanes with ready work
ARGV[1] at most this many lanes (from the ring's head), ARGV[2] at most this many bands a lane
Returns: 3 entries per band head: lane, id, ms it became ready (run_after, else enqueued_at;
        0 when the row has neither: the id's mint time says it)
]]
local base, ring = KEYS[1], KEYS[2]
local max_lanes, max_bands = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for _, lane in ipairs(redis.call('LRANGE', ring, 0, max_lanes - 1)) do
  local lk = lane_key(base, lane)
  local head = redis.call('ZRANGE', lk, 0, 0, 'WITHSCORES')
  local bands = 0
  while head[1] and bands < max_bands do
    local row = redis.call('HMGET', job_key(base, head[1]), 'run_after', 'enqueued_at')
    out[#out + 1] = lane; out[#out + 1] = head[1]
    out[#out + 1] = count_field(row[1]) or count_field(row[2]) or 0
    bands = bands + 1
    head = redis.call('ZRANGE', lk, '(' .. head[2], '+inf', 'BYSCORE', 'LIMIT', 0, 1, 'WITHSCORES')
  end
end
return out
