--[[ heads (read-only; the console and the oldest-wait figure): the first job of each priority
band of each lane with ready work, and when it became ready. A lane is served in order, highest
priority first and FIFO within one, so whatever waits longest waits at the head of a band.
KEYS[1] base    prefix  emq:{q}; reads rows base:job:<id>, lanes base:pending / base:lane:<l>
KEYS[2] ring    LIST    lanes with ready work
KEYS[3] capped  SET     lanes with ready work held off the ring at their cap
KEYS[4] rated   ZSET    lanes with ready work held off the ring by their rate
ARGV[1] lanes      at most this many lanes from the ring's head, and as many from each of
        capped and rated (a held lane's jobs wait too, often longest)
ARGV[2] bands      at most this many bands a lane
Returns: 3 entries per band head: lane, id, ms it became ready (run_after, else enqueued_at;
        0 when the row has neither: the id's mint time says it)
]]
-- uses: lane_key, job_key, count_field
local base, ring, capped, rated = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local max_lanes, max_bands = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, seen = {}, {}

local function band_heads(lane)
  if seen[lane] then return end
  seen[lane] = true
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

for _, lane in ipairs(redis.call('LRANGE', ring, 0, max_lanes - 1)) do band_heads(lane) end
for _, lane in ipairs(redis.call('SRANDMEMBER', capped, max_lanes)) do band_heads(lane) end
for _, lane in ipairs(redis.call('ZRANGE', rated, 0, max_lanes - 1)) do band_heads(lane) end
return out
