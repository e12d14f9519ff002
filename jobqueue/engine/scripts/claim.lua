--[[ claim: record the successes a worker brings (as ack.lua), then lease up to `count` ready
jobs, one lane per turn (round-robin over the ring; a lane of weight w keeps the ring's head for
w turns in a row): a worker's steady state is one round trip per batch, as BullMQ's
moveToFinished fetches the next job.
KEYS[1] base    prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                        base:lane:<l>, and as a job finishes base:hist, base:m:<minute>,
                        base:uniq:<key>, base:uniqs, base:notify:<id>, base:flow:<id>, and for
                        its dependents base:deps:<id>, base:results:<id>, base:outcomes,
                        base:waiting; base:ring LIST lanes with ready work, rotated one step
                        per turn with LMOVE; base:done STREAM terminal events; base:wake LIST
                        wake tokens (for lanes the successes bring back from their cap and this
                        claim leaves on the ring: one push, not one per lane); base:slots HASH
                        lane -> its active jobs that hold a slot of its cap; base:capped SET
                        lanes held off the ring at their cap; base:rated ZSET lanes held off
                        the ring by their rate: lane -> ms their next token is due
                        (a released dependent handed to an idle worker: base:idle,
                        base:hand:<name>; _handoff.lua)
KEYS[2] active  ZSET    id -> lease deadline ms (server clock)
KEYS[3] meta    HASH    paused; caps = '1' while base:caps holds a cap set live; gcap = the
                        queue's global cap set live (permits.lua), absent while none is
KEYS[4] dead    ZSET    id -> finished ms (rows too corrupt to run are buried here)
KEYS[5] idle    HASH    idle workers (see enqueue.lua): a worker that claims a job is idle no more
KEYS[6] caps    HASH    lane ('*': every named lane) -> a cap set live (wins over ARGV's)
ARGV[1] count           at most this many jobs
ARGV[2] lease_ms        default lease ms
ARGV[3] override        '1' = ARGV[2] overrides each job's lease
ARGV[4] worker          worker name
ARGV[5] dead_retention  ms a dead row is kept
ARGV[6] retention       ms a finished row is kept
ARGV[7..] policy        the shard's rate limit: jobs per period (its share of the queue's N; 0 =
        no limit), the period ms, each named lane's rate limit: jobs per period (0 = none), its
        period ms, then c = number of lane caps, then 2 per cap: lane ('*': every named lane
        not listed), cap; then w = number of weighted lanes, then 2 per lane: name, weight
        (2…100; others weigh 1); then the global cap's live setting as the claimer knows it
        ('' = none: meta's gcap; the claimer's count is bounded by the permits it holds)
ARGV[..] claim_id       the claim's id ('' = none: written on each row it leases as `claim`, so
        that a claim whose reply was lost can be handed back, see release.lua)
ARGV[..] successes      n successes to record, then 3 per job: id, token, result (JSON)
Turns a weighted lane has had in the current round are kept in base:turns (HASH lane -> n); a
rate limit's token bucket in base:bucket (HASH tokens, at ms), a lane's in base:lbucket:<lane>,
refilled on the server clock.
A lane out of tokens leaves the ring (base:rated) when a turn spends its last one; a lane at its
cap (a live cap, else ARGV's for the lane, else the '*' one) when a turn meets it there (one a
turn brings to its cap stays until the next look: a slot often frees first). A held lane is not
looked at again until a transition frees a slot (_lanes.lua's free_slot) or its next token is
due (moved back here or by promote.lua), so a claim's cost does not grow with the lanes held
back: a lane costs one look after it reached its cap, and such a turn is not counted in the
claim's limit of turns. A job past its `expires_at` is not run:
it ends `expired` in this call.
Returns: n, the n answers of the successes (as ack.lua's: 1 succeeded, 3 cancelled, each plus
        1 when forwarded to another shard: relay.py; 0 stale), the ms until the rate limit
        admits another job (0: not limited now; when the claim came back short, also the ms
        until a lane held by its rate has a token; -1: nothing leased, the global cap's live
        setting is not the claimer's: it asks for permits again), then 5 entries per claimed
        job: id, token (the new `attempts`: the fencing token), payload, checkpoint ('' =
        none), lease ms (for a job with a run time limit, '<lease ms>:<timeout ms>'). No job is
        claimed when the queue is paused or nothing is ready.
A job with a run time limit (its lease_ms field '<lease>:<timeout>') gets a lease of at most
timeout + 1 s, so a dead worker's job comes back soon. The limit counts from the run's start,
not from this claim (a prefetched job may wait in the worker first): the worker's first renewal
of the started run writes its `deadline` (extend.lua); a deadline an earlier attempt left is
removed here.
        A popped row with a corrupt state, count, priority, lane or expires_at is buried (dead,
        with the field named in last_error) and not returned; payload and checkpoint are
        checked by the caller, which decodes them anyway.
]]
-- uses: now_ms, ack_jobs, lane_back, STATES, count_field, valid_priority, valid_lane, job_key, bury
-- uses: finish, lane_key, wake_workers, lease_field
local base, active, meta, dead, idle, caps = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local ring, done, wake = base .. ':ring', base .. ':done', base .. ':wake'
local count, default_lease, force, worker = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4]
local dead_retention, retention = tonumber(ARGV[5]), tonumber(ARGV[6])
local rate, period = tonumber(ARGV[7]), tonumber(ARGV[8])
local lane_rate, lane_period = tonumber(ARGV[9]), tonumber(ARGV[10])
local given_caps, ncaps = {}, tonumber(ARGV[11])
for i = 0, ncaps - 1 do given_caps[ARGV[12 + i * 2]] = tonumber(ARGV[13 + i * 2]) end
local at = 12 + ncaps * 2
local weights, nweights = {}, tonumber(ARGV[at])
for i = 0, nweights - 1 do weights[ARGV[at + 1 + i * 2]] = tonumber(ARGV[at + 2 + i * 2]) end
local turns_key = base .. ':turns'
local gcap = ARGV[at + 1 + nweights * 2]
local claim_id = ARGV[at + 2 + nweights * 2]
local now = now_ms()  -- (one clock reading for the acks and the claim)
local out, back = ack_jobs(base, active, done, meta, ring, retention, ARGV, at + 3 + nweights * 2,
  now)
table.insert(out, 1, #out)
out[#out + 1] = 0  -- ms until the rate limit admits a job: set below when it holds one back
local waited_at = #out
local flags = redis.call('HMGET', meta, 'paused', 'caps', 'gcap')
if flags[1] == '1' then return out end
if (flags[3] or '') ~= gcap then out[waited_at] = -1; return out end
local live_caps = flags[2] == '1'
local lanes_limited = live_caps or ncaps > 0 or lane_rate > 0
local slots, capped, rated = nil, nil, nil  -- (read only where lanes are limited)
if lanes_limited then
  slots, capped, rated = base .. ':slots', base .. ':capped', base .. ':rated'
end

-- A token bucket on the server clock: refilled continuously at `n` per `ms`, holding at most n
-- (at least one: a shard's share of a small limit may be a fraction of a job per period).
local function bucket_level(key, n, ms)
  local b = redis.call('HMGET', key, 'tokens', 'at')
  local capacity = math.max(n, 1)
  local level = tonumber(b[1]) or capacity
  return math.min(capacity, level + math.max(now - (tonumber(b[2]) or now), 0) * n / ms)
end

local bucket, tokens = base .. ':bucket', 0
if rate > 0 then
  tokens = bucket_level(bucket, rate, period)
  if tokens < 1 then
    out[waited_at] = math.ceil((1 - tokens) * period / rate)
    redis.call('HSET', bucket, 'tokens', tostring(tokens), 'at', now)
    return out
  end
  count = math.min(count, math.floor(tokens))
end
if lane_rate > 0 then  -- lanes whose next token is due come back (promote.lua does it too)
  for _, lane in ipairs(redis.call('ZRANGEBYSCORE', rated, '-inf', now, 'LIMIT', 0, 100)) do
    redis.call('ZREM', rated, lane)
    lane_back(base, ring, lane)
  end
end
local claimed, turns = 0, 0

-- The first field (in this order) that a claimed job relies on and that is corrupt, or nil.
local function corrupt_field(r)
  if not STATES[r[1]] then return 'state' end
  if r[2] and not count_field(r[2]) then return 'attempts' end
  if r[3] and not count_field(r[3]) then return 'uncharged' end
  if r[4] and (count_field(r[4]) or 0) < 1 then return 'max_attempts' end
  if r[5] and not lease_field(r[5]) then return 'lease_ms' end
  if r[6] and not count_field(r[6]) then return 'backoff_ms' end
  if r[7] and not valid_priority(r[7]) then return 'priority' end
  if not valid_lane(r[8] or '') then return 'lane' end
  if r[11] and not count_field(r[11]) then return 'expires_at' end
  return nil
end

-- Lease one popped id (`slot`: it takes a slot of its lane's cap, which the turn reserved, marked
-- on the row in the same HSET; a mark left by an earlier attempt, whose slot was freed already,
-- goes when this one takes none). A lane entry whose row is gone (expired) or no longer pending
-- is a stale index entry and is dropped; a corrupt row is buried; one past its expiry ends
-- `expired`. A missing attempts, max_attempts or priority is its default (the enqueue writes
-- only what differs from one).
local function lease_job(id, lane, slot)
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'uncharged', 'max_attempts',
    'lease_ms', 'backoff_ms', 'priority', 'lane', 'payload', 'checkpoint', 'expires_at', 'slot')
  if row[1] ~= 'pending' and (not row[1] or STATES[row[1]]) then return end
  local bad = corrupt_field(row)
  if bad then return bury(base, dead, done, meta, jk, id, bad, now, dead_retention) end
  if row[11] and now >= tonumber(row[11]) then
    redis.call('HSET', jk, 'last_error', 'expired before it started')
    return finish(base, done, meta, jk, id, 'expired', now, retention)
  end
  local token = (tonumber(row[2]) or 0) + 1
  local lease, limit = 0, 0
  if row[5] then lease, limit = lease_field(row[5]) end
  if force == '1' or lease <= 0 then lease = default_lease end
  if limit > 0 then lease = math.min(lease, limit + 1000) end  -- (see the header: run timeouts)
  if slot then
    redis.call('HSET', jk, 'state', 'active', 'attempts', token, 'started_at', now,
      'lease_until', now + lease, 'worker', worker, 'claim', claim_id, 'slot', '1')
  else
    redis.call('HSET', jk, 'state', 'active', 'attempts', token, 'started_at', now,
      'lease_until', now + lease, 'worker', worker, 'claim', claim_id)
    if row[12] then redis.call('HDEL', jk, 'slot') end
  end
  redis.call('ZADD', active, now + lease, id)
  out[#out + 1] = id; out[#out + 1] = token; out[#out + 1] = row[9] or ''
  out[#out + 1] = row[10] or ''; out[#out + 1] = lease
  if limit > 0 then
    redis.call('HDEL', jk, 'deadline')  -- (an earlier attempt's: see the header)
    out[#out] = lease .. ':' .. limit
  end
  claimed = claimed + 1
end

-- A lane leaves the ring: it was moved to the tail this turn, or kept the head (a weighted
-- lane's turns), so LREM finds it at once from that end.
local function leave_ring(lane, at_tail)
  redis.call('LREM', ring, at_tail and -1 or 1, lane)
  if nweights > 0 then redis.call('HDEL', turns_key, lane) end
end

-- A lane's cap: a live one for it, else the settings' for it, else (a named lane) the '*' ones.
local function cap_of(lane)
  local live = live_caps and redis.call('HMGET', caps, lane, '*') or {}
  local cap = live[1] or given_caps[lane]
  if not cap and lane ~= '' then cap = live[2] or given_caps['*'] end
  return tonumber(cap)
end

-- Give back `n` slots of a lane's cap that a turn reserved and did not use.
local function unreserve(lane, n)
  if n > 0 and redis.call('HINCRBY', slots, lane, -n) <= 0 then redis.call('HDEL', slots, lane) end
end

-- What a lane's limits let this turn start: (room, cap, tokens), room nil when unlimited. A
-- capped lane's slots for the turn (`want`, or its room if less) are reserved at once: one
-- HINCRBY both reads how many are taken and takes them (the turn gives back what it does not
-- lease). A lane with no room leaves the ring, held (at its cap, or until its next token is due).
local function lane_room(lane, at_tail, want)
  local cap = cap_of(lane)
  local room = cap and cap - (redis.call('HINCRBY', slots, lane, want) - want)
  if room and room < want then unreserve(lane, want - math.max(room, 0)) end
  if room and room <= 0 then
    leave_ring(lane, at_tail)
    redis.call('SADD', capped, lane)
    return 0
  end
  if lane_rate <= 0 or lane == '' then return room, cap end
  local level = bucket_level(base .. ':lbucket:' .. lane, lane_rate, lane_period)
  local limited = math.min(room or level, math.floor(level))
  if room then unreserve(lane, math.min(room, want) - math.max(math.min(limited, want), 0)) end
  if level < 1 then
    leave_ring(lane, at_tail)
    redis.call('ZADD', rated, now + math.ceil((1 - level) * lane_period / lane_rate), lane)
    return 0
  end
  return limited, cap, level
end

-- After a turn took `n` jobs of a lane with a rate: spend its tokens, and hold it back now if it
-- has work left but no token (no later turn need look at it: its next token is a known time
-- away). A lane the turn brought to its cap stays on the ring: a slot often frees before the
-- ring comes round to it (the holder's ack rides its next claim), and if none did, the turn that
-- meets it takes it off then, one look later (`lane_room`). Taking it off at once and back at
-- each ack cost more than that look (bench/RESULTS.md, issue 26).
local function lane_took(lane, at_tail, n, level, emptied)
  level = level - n
  local lb = base .. ':lbucket:' .. lane
  redis.call('HSET', lb, 'tokens', tostring(level), 'at', now)
  redis.call('PEXPIRE', lb, lane_period)  -- (full again by then: as good as no bucket)
  if emptied or level >= 1 then return end
  leave_ring(lane, at_tail)
  redis.call('ZADD', rated, now + math.ceil((1 - level) * lane_period / lane_rate), lane)
end

while claimed < count and turns < count * 4 do
  turns = turns + 1
  -- One lane with work: round-robin is moot, so take the rest of the batch from it at once.
  local single = count - claimed > 1 and redis.call('LLEN', ring) == 1
  local lane, at_tail = nil, true
  if nweights == 0 then
    lane = redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
  else  -- a lane keeps the head until its turns this round are over
    lane = redis.call('LINDEX', ring, 0)
    local weight = lane and weights[lane] or 1
    at_tail = false
    if lane and (weight == 1 or redis.call('HINCRBY', turns_key, lane, 1) >= weight) then
      if weight > 1 then redis.call('HDEL', turns_key, lane) end
      redis.call('LMOVE', ring, ring, 'LEFT', 'RIGHT')
      at_tail = true
    end
  end
  if not lane then break end
  local want = single and (count - claimed) or 1
  local room, cap, level = nil, nil, nil
  if lanes_limited then room, cap, level = lane_room(lane, at_tail, want) end
  if room then want = math.min(want, room) end  -- (for a capped lane: what it reserved)
  -- (a turn that took a held lane off the ring is not counted: the ring shrank, so the loop
  -- still ends, and a claim does not come back short for lanes that reached their cap lately)
  if room == 0 then turns = turns - 1 end
  if want > 0 then
    local lk = lane_key(base, lane)
    local popped = redis.call('ZPOPMIN', lk, want)
    local emptied = redis.call('ZCARD', lk) == 0
    if emptied then leave_ring(lane, at_tail) end
    local before = claimed
    for i = 1, #popped, 2 do
      local ok, err = pcall(lease_job, popped[i], lane, cap ~= nil)
      if not ok then
        -- A failure here (a bug, a bad argument) must not strand what this call popped: the jobs
        -- not leased go back on their lane, and the lane on the ring, before the error is told.
        for j = i, #popped, 2 do redis.call('ZADD', lk, popped[j + 1], popped[j]) end
        if not redis.call('LPOS', ring, lane) then redis.call('RPUSH', ring, lane) end
        if cap then unreserve(lane, want - (claimed - before)) end
        error(err)
      end
    end
    -- (a stale entry, a buried or an expired row took no slot of what the turn reserved)
    if cap then unreserve(lane, want - (claimed - before)) end
    if level then lane_took(lane, at_tail, claimed - before, level, emptied) end
  end
end
if rate > 0 then
  tokens = tokens - claimed
  redis.call('HSET', bucket, 'tokens', tostring(tokens), 'at', now)
  if tokens < 1 then out[waited_at] = math.ceil((1 - tokens) * period / rate) end
end
if out[waited_at] == 0 and claimed < count and lane_rate > 0 then
  local nxt = redis.call('ZRANGE', rated, 0, 0, 'WITHSCORES')
  if nxt[2] then out[waited_at] = math.max(tonumber(nxt[2]) - now, 1) end
end
-- Lanes the successes brought back that this claim left on the ring: a worker is woken for each
-- (none when the claim took the ring's last work).
if back > 0 then wake_workers(wake, math.min(back, redis.call('LLEN', ring))) end
-- (a claim that finds nothing, an idle worker's maintenance turn, leaves its offer standing)
if claimed > 0 and worker ~= '' then redis.call('HDEL', idle, worker) end
return out
