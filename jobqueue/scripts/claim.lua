--[[ claim: lease up to `count` ready jobs, one lane per turn (round-robin over the ring).
KEYS[1] base    prefix  emq:{q}
KEYS[2] ring    LIST    lanes with ready work; rotated one step per turn with LMOVE
KEYS[3] active  ZSET    id -> lease deadline ms (server clock)
KEYS[4] meta    HASH    paused
ARGV[1] count, ARGV[2] default lease ms, ARGV[3] '1' = ARGV[2] overrides each job's lease,
ARGV[4] worker name
Returns: 5 entries per claimed job: id, token (the new `attempts`: the fencing token),
        payload, checkpoint ('' = none), lease ms. Empty when paused or nothing is ready.
]]
local base, ring, active, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local count, default_lease, force, worker = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
if redis.call('HGET', meta, 'paused') == '1' then return {} end
local now = now_ms()
local out, claimed, turns = {}, 0, 0

-- Lease one popped id; a lane entry without a pending row (expired or hand-edited) is dropped.
local function lease_job(id)
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'payload', 'checkpoint', 'lease_ms')
  if row[1] ~= 'pending' then return end
  local token = redis.call('HINCRBY', jk, 'attempts', 1)
  local lease = tonumber(row[4]) or 0
  if force == '1' or lease <= 0 then lease = default_lease end
  redis.call('HSET', jk, 'state', 'active', 'started_at', now, 'lease_until', now + lease,
    'worker', worker)
  redis.call('ZADD', active, now + lease, id)
  redis.call('ZREM', base .. ':waiting', id)
  out[#out + 1] = id; out[#out + 1] = token; out[#out + 1] = row[2] or ''
  out[#out + 1] = row[3] or ''; out[#out + 1] = lease
  claimed = claimed + 1
end

while claimed < count and turns < count * 4 do
  turns = turns + 1
  -- One lane with work: round-robin is moot, so take the rest of the batch from it at once.
  local single = redis.call('LLEN', ring) == 1
  local lane = redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
  if not lane then break end
  local lk = lane_key(base, lane)
  local popped = redis.call('ZPOPMIN', lk, single and (count - claimed) or 1)
  if redis.call('ZCARD', lk) == 0 then redis.call('LREM', ring, 0, lane) end
  for i = 1, #popped, 2 do lease_job(popped[i]) end
end
return out
