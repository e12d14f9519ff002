--[[ claim: record the successes a worker brings (as ack.lua), then lease up to `count` ready
jobs, one lane per turn (round-robin over the ring; a lane of weight w keeps the ring's head for
w turns in a row): a worker's steady state is one round trip per batch, as BullMQ's
moveToFinished fetches the next job.
KEYS[1] base    prefix  emq:{q}
KEYS[2] ring    LIST    lanes with ready work; rotated one step per turn with LMOVE
KEYS[3] active  ZSET    id -> lease deadline ms (server clock)
KEYS[4] meta    HASH    paused
KEYS[5] dead    ZSET    id -> finished ms (rows too corrupt to run are buried here)
KEYS[6] done    STREAM  terminal events
KEYS[7] idle    HASH    idle workers (see enqueue.lua): a worker that claims a job is idle no more
ARGV[1] count, ARGV[2] default lease ms, ARGV[3] '1' = ARGV[2] overrides each job's lease,
ARGV[4] worker name, ARGV[5] dead retention ms, ARGV[6] retention ms of a finished row,
ARGV[7] the shard's rate limit: jobs per period (its share of the queue's N; 0 = no limit),
ARGV[8] the period ms, ARGV[9] w = number of weighted lanes, then 2 per lane: name, weight
(2…100; others weigh 1), then n successes to record, then 3 per job: id, token, result (JSON)
Turns a weighted lane has had in the current round are kept in base:turns (HASH lane -> n); a
rate limit's token bucket in base:bucket (HASH tokens, at ms), refilled on the server clock.
Returns: n, the n answers of the successes (1 recorded, 0 stale), the ms until the rate limit
        admits another job (0: not limited now), then 5 entries per claimed job: id, token (the
        new `attempts`: the fencing token), payload, checkpoint ('' = none), lease ms. No job is
        claimed when the queue is paused or nothing is ready.
        A popped row with a corrupt state, count, priority or lane is buried (dead, with the
        field named in last_error) and not returned; payload and checkpoint are checked by
        the caller, which decodes them anyway.
]]
local base, ring, active, meta, dead, done = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local count, default_lease, force, worker = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local dead_retention = tonumber(ARGV[5])
local rate, period = tonumber(ARGV[7]), tonumber(ARGV[8])
local weights, nweights = {}, tonumber(ARGV[9])
for i = 0, nweights - 1 do weights[ARGV[10 + i * 2]] = tonumber(ARGV[11 + i * 2]) end
local turns_key = base .. ':turns'
local out = ack_jobs(base, active, done, meta, tonumber(ARGV[6]), 10 + nweights * 2)
table.insert(out, 1, #out)
out[#out + 1] = 0  -- ms until the rate limit admits a job: set below when it holds one back
local waited_at = #out
if redis.call('HGET', meta, 'paused') == '1' then return out end
local now = now_ms()

-- The token bucket: refilled continuously at `rate` per `period`, holding at most `rate` (at
-- least one: a shard's share of a small limit may be a fraction of a job per period).
local bucket, tokens = base .. ':bucket', 0
if rate > 0 then
  local b = redis.call('HMGET', bucket, 'tokens', 'at')
  local capacity = math.max(rate, 1)
  tokens = tonumber(b[1]) or capacity
  local elapsed = math.max(now - (tonumber(b[2]) or now), 0)
  tokens = math.min(capacity, tokens + elapsed * rate / period)
  if tokens < 1 then
    out[waited_at] = math.ceil((1 - tokens) * period / rate)
    redis.call('HSET', bucket, 'tokens', tostring(tokens), 'at', now)
    return out
  end
  count = math.min(count, math.floor(tokens))
end
local claimed, turns = 0, 0

-- The first field (in this order) that a claimed job relies on and that is corrupt, or nil.
local function corrupt_field(r)
  if not STATES[r[1]] then return 'state' end
  if r[2] and not count_field(r[2]) then return 'attempts' end
  if r[3] and not count_field(r[3]) then return 'uncharged' end
  if r[4] and (count_field(r[4]) or 0) < 1 then return 'max_attempts' end
  if r[5] and not count_field(r[5]) then return 'lease_ms' end
  if r[6] and not count_field(r[6]) then return 'backoff_ms' end
  if r[7] and not valid_priority(r[7]) then return 'priority' end
  if not valid_lane(r[8] or '') then return 'lane' end
  return nil
end

-- Lease one popped id. A lane entry whose row is gone (expired) or no longer pending is a
-- stale index entry and is dropped; a corrupt row is buried. A missing attempts, max_attempts
-- or priority is its default (the enqueue writes only what differs from one).
local function lease_job(id)
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'uncharged', 'max_attempts',
    'lease_ms', 'backoff_ms', 'priority', 'lane', 'payload', 'checkpoint')
  if row[1] ~= 'pending' and (not row[1] or STATES[row[1]]) then return end
  local bad = corrupt_field(row)
  if bad then return bury(base, dead, done, meta, jk, id, bad, now, dead_retention) end
  local token = (tonumber(row[2]) or 0) + 1
  local lease = tonumber(row[5]) or 0
  if force == '1' or lease <= 0 then lease = default_lease end
  redis.call('HSET', jk, 'state', 'active', 'attempts', token, 'started_at', now,
    'lease_until', now + lease, 'worker', worker)
  redis.call('ZADD', active, now + lease, id)
  out[#out + 1] = id; out[#out + 1] = token; out[#out + 1] = row[9] or ''
  out[#out + 1] = row[10] or ''; out[#out + 1] = lease
  claimed = claimed + 1
end

while claimed < count and turns < count * 4 do
  turns = turns + 1
  -- One lane with work: round-robin is moot, so take the rest of the batch from it at once.
  local single = count - claimed > 1 and redis.call('LLEN', ring) == 1
  local lane
  if nweights == 0 then
    lane = redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
  else  -- a lane keeps the head until its turns this round are over
    lane = redis.call('LINDEX', ring, 0)
    local weight = lane and weights[lane] or 1
    if lane and (weight == 1 or redis.call('HINCRBY', turns_key, lane, 1) >= weight) then
      if weight > 1 then redis.call('HDEL', turns_key, lane) end
      redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
    end
  end
  if not lane then break end
  local lk = lane_key(base, lane)
  local popped = redis.call('ZPOPMIN', lk, single and (count - claimed) or 1)
  if redis.call('ZCARD', lk) == 0 then
    redis.call('LREM', ring, 0, lane)
    -- (turns are counted for weighted lanes only; one left from weights since removed costs
    -- its lane at most one short round, should they come back)
    if nweights > 0 then redis.call('HDEL', turns_key, lane) end
  end
  for i = 1, #popped, 2 do
    local ok, err = pcall(lease_job, popped[i])
    if not ok then
      -- A failure here (a bug, a bad argument) must not strand what this call popped: the jobs
      -- not leased go back on their lane, and the lane on the ring, before the error is told.
      for j = i, #popped, 2 do redis.call('ZADD', lk, popped[j + 1], popped[j]) end
      if not redis.call('LPOS', ring, lane) then redis.call('RPUSH', ring, lane) end
      error(err)
    end
  end
end
if rate > 0 then
  tokens = tokens - claimed
  redis.call('HSET', bucket, 'tokens', tostring(tokens), 'at', now)
  if tokens < 1 then out[waited_at] = math.ceil((1 - tokens) * period / rate) end
end
-- (a claim that finds nothing, an idle worker's maintenance turn, leaves its offer standing)
if claimed > 0 and worker ~= '' then redis.call('HDEL', KEYS[7], worker) end
return out
