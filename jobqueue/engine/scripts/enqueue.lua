--[[ enqueue: write new job rows and make them ready (or scheduled when delayed).
KEYS[1] base      prefix  emq:{q}; rows are base:job:<id>, lanes base:pending / base:lane:<l>,
                          unique keys base:uniq:<key> and base:uniqs, hand-offs base:hand:<name>;
                          a debounced pending job leaves its lane: base:turns, base:capped,
                          base:rated
KEYS[2] ring      LIST    lanes with ready work
KEYS[3] schedule  ZSET    id -> due ms
KEYS[4] wake      LIST    wake tokens for blocked workers
KEYS[5] meta      HASH    'draining' set: the shard takes no new jobs (a resize shrank the queue);
                          'paused'; 'listed': the producer recorded the queue in the registry
                          (gone with the rest after Valkey lost its data: then listed again);
                          'caps': a lane cap was set live; 'gcap': a global cap was (unless
                          '0': lifted); either stops hand-offs
KEYS[6] active    ZSET    id -> lease deadline ms (a job handed to an idle worker is leased here)
KEYS[7] idle      HASH    idle workers: name -> '<lease ms>:<1 = it overrides the job's lease>'
                          and ':<offer id>' (the job handed over keeps it as `claim`:
                          _handoff.lua), each field expiring when its worker's wait does
ARGV[1] mode       '' = place here; 'prior' = the shard the job's lane or unique key had
        before a resize, which takes it only while that lane holds ready jobs here (its order
        holds) and returns the live job of its unique key (one live job per key)
ARGV[2..] jobs     n = number of jobs, then 12 per job:
        id, payload (JSON), priority, lane ('' = default), max_attempts and backoff_ms ('' = the
        queue's, read from settings when the job fails), lease_ms (0 = worker default; with a
        run time limit '<lease ms>:<timeout ms>', written so: claim.lua), delay_ms
        (0 = ready now), unique_key ('' = none), minted ('1' when the caller did not choose the
        id; '0' when it did; '0:<n>' when it did and the job's earlier runs may have used tokens
        up to n: a durable row restored, a job retried from its mirror row, whose attempts and
        uncharged start at n, so that no fencing token repeats and its budget stays whole),
        debounce_ms (0 = none; else it equals delay_ms), expires_ms (0 = never; else the row's
        expires_at = now + it, which the claim checks)
Debounce: while the unique key's job has never started (pending or scheduled, attempts 0), a
debounced enqueue replaces its payload and expiry (none given: none) and moves it to scheduled
at now + debounce_ms, answering its id; once that job started (claimed once: running, or waiting
again for a retry, after a release, a reap or an operator's retry) or finished, the enqueue
makes a new job and the key names it from then on (the started job goes on with its payload).
The row holds only what differs from a default (a waiting job's bytes are RAM): no attempts,
uncharged or priority while 0, no lane, unique_key or policy field while default, no run_after
unless delayed, no enqueued_at for an id minted by the caller's enqueue (its mint time says it).
Scripts read a missing field as its default.
The hand-off: a lone job that is ready now, on a shard with no other ready job (so no lane,
priority or weight could come first) and not paused, goes straight to an idle worker if one
waits here: the script leases it as claim.lua would (attempts 1, the worker's lease) and pushes
'<id>|<lease ms>|<payload>' (for a job with a run time limit '<id>|<lease>:<timeout>|<payload>',
its lease capped as claim.lua caps it; its `deadline` comes with the renewal of its started run:
extend.lua) onto that worker's list base:hand:<name> (expiring ten minutes after
the lease: a worker that died before it took the job leaves it there for the reaper, which
hands it back uncharged), which the worker's BLPOP returns. The worker needs no claim call; no
wake token is pushed. Each idle entry takes one job.
A job handed over is new and ready now, so it cannot have expired (expires_ms > 0); a queue with
lane caps or lane rates has no idle entries (its workers never offer), and a cap set live stops
hand-offs here ('caps' in meta), as a global cap set live does ('gcap'), since only the
claim counts slots and permits.
Returns: 1 when the shard's meta says 'listed', else 0; then per job two entries: id, status —
        'new' (also when a minted id and payload are found: this call's first send wrote them);
        'exists' (unique_key or caller's id already live: id is the existing job's);
        'debounced' (id is the waiting job whose payload and start this call replaced);
        'collision' (a minted id already taken: mint again);
        'moved' (mode '': the shard is draining; re-read the layout); 'absent' (mode 'prior':
        neither the lane nor the key is here; place it on its live shard)
]]
-- uses: now_ms, job_key, unready, uniq_key, lane_key, uniqs_key, lane_push, wake_workers
-- uses: idle_taker, hand_lease, hand_push
local base, ring, schedule, wake, meta, active, idle = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6], KEYS[7]
local prior, n = ARGV[1] == 'prior', tonumber(ARGV[2])
local now = nil  -- the server clock, read once and only when a row needs it (see at())
local function at()
  now = now or now_ms()
  return now
end
local flags = redis.call('HMGET', meta, 'draining', 'paused', 'listed', 'caps', 'gcap')
local out, ready = {flags[3] and 1 or 0}, 0
local filled = {}  -- lanes this call already put on the ring (or found there)
if not prior and flags[1] then
  for i = 0, n - 1 do out[#out + 1] = ARGV[3 + i * 12]; out[#out + 1] = 'moved' end
  return out
end

-- An idle worker to hand a lone ready job to (see above): {name, lease ms, overrides}, or nil.
local function idle_worker()
  if n ~= 1 or prior then return nil end
  return idle_taker(idle, ring, flags[2], flags[4], flags[5])
end

-- Add a field to a row's HSET arguments unless it holds the default.
local function put(row, name, value, default)
  if value ~= default then row[#row + 1] = name; row[#row + 1] = value end
end

-- A debounced enqueue meets the key's job: replace its payload and start while it has never
-- started (true), or leave it be once a worker claimed it (false: the enqueue makes a new job).
-- A claim spends a fencing token (`attempts`, never lowered), so a job waiting again after a run
-- (a retry after a failure, a release, a reaped lease, an operator's retry) has started.
local function debounced(other, o)
  local ok = job_key(base, other)
  local row = redis.call('HMGET', ok, 'state', 'attempts')
  local state = row[1]
  if (state ~= 'pending' and state ~= 'scheduled') or (row[2] or '0') ~= '0' then return false end
  -- (the lane may leave the ring here: a later job of this call must put it back)
  if state == 'pending' then filled[unready(base, ring, ok, other)] = nil end
  local due = at() + tonumber(ARGV[o + 10])
  local fields = {'state', 'scheduled', 'payload', ARGV[o + 1], 'run_after', due}
  -- The expiry is the last enqueue's too (none given: none), as the enqueue checked it against
  -- this start: an old one kept could fall before it, and the last arguments would never run.
  if ARGV[o + 11] ~= '0' then
    fields[7], fields[8] = 'expires_at', at() + tonumber(ARGV[o + 11])
  else
    redis.call('HDEL', ok, 'expires_at')
  end
  redis.call('HSET', ok, unpack(fields))
  redis.call('ZADD', schedule, due, other)
  return true
end

for i = 0, n - 1 do
  local o = 3 + i * 12
  local id, unique = ARGV[o], ARGV[o + 8]
  local jk = job_key(base, id)
  local other = nil
  if unique ~= '' then
    other = redis.call('GET', uniq_key(base, unique))
    if other and redis.call('EXISTS', job_key(base, other)) == 0 then other = nil end
  end
  local debounce = ARGV[o + 10] ~= '0'
  if other and debounce and debounced(other, o) then
    out[#out + 1] = other; out[#out + 1] = 'debounced'
  elseif other and not debounce then
    -- (the key names this very job, with this minted id and payload: this call's first send
    -- wrote it, and its reply was lost; the replay answers as that send did)
    local own = other == id and ARGV[o + 9] == '1'
      and redis.call('HGET', jk, 'payload') == ARGV[o + 1]
    out[#out + 1] = other; out[#out + 1] = own and 'new' or 'exists'
  elseif prior
      and (ARGV[o + 3] == '' or redis.call('EXISTS', lane_key(base, ARGV[o + 3])) == 0) then
    out[#out + 1] = id; out[#out + 1] = 'absent'
  elseif redis.call('EXISTS', jk) == 1 then
    local status = 'exists'  -- (a minted id with this payload: this call's own first send)
    if ARGV[o + 9] == '1' then
      status = redis.call('HGET', jk, 'payload') == ARGV[o + 1] and 'new' or 'collision'
    end
    out[#out + 1] = id; out[#out + 1] = status
  else
    local delay = tonumber(ARGV[o + 7])
    local spent = nil  -- (a restored row's tokens: see ARGV; a hand-off's token is always 1)
    if ARGV[o + 9] ~= '1' and ARGV[o + 9] ~= '0' then
      spent = string.match(ARGV[o + 9], '^0:(%d+)$')
    end
    local taker = delay == 0 and not spent and idle_worker() or nil
    local row = {'state', (delay > 0) and 'scheduled' or (taker and 'active' or 'pending'),
      'payload', ARGV[o + 1]}
    if ARGV[o + 9] ~= '1' then put(row, 'enqueued_at', at(), nil) end  -- else: the id's mint time
    if spent then put(row, 'attempts', spent, nil); put(row, 'uncharged', spent, nil) end
    put(row, 'priority', ARGV[o + 2], '0'); put(row, 'lane', ARGV[o + 3], '')
    put(row, 'max_attempts', ARGV[o + 4], ''); put(row, 'backoff_ms', ARGV[o + 5], '')
    put(row, 'lease_ms', ARGV[o + 6], '0'); put(row, 'unique_key', unique, '')
    if delay > 0 then put(row, 'run_after', at() + delay, nil) end
    if ARGV[o + 11] ~= '0' then put(row, 'expires_at', at() + tonumber(ARGV[o + 11]), nil) end
    local lease, limit = nil, 0  -- (read only for a job handed over)
    if taker then  -- leased as claim.lua leases a job (attempts 1: the fencing token)
      lease, limit = hand_lease(taker, ARGV[o + 6])
      for _, v in ipairs({'attempts', 1, 'started_at', at(), 'lease_until', at() + lease,
          'worker', taker[1]}) do row[#row + 1] = v end
      put(row, 'claim', taker[4], '')  -- (the offer's id: see _handoff.lua)
    end
    redis.call('HSET', jk, unpack(row))
    if unique ~= '' then
      redis.call('SET', uniq_key(base, unique), id)
      redis.call('SADD', uniqs_key(base), unique)
    end
    if taker then
      hand_push(base, active, id, taker, lease, limit, ARGV[o + 1], at())
    elseif delay > 0 then
      redis.call('ZADD', schedule, at() + delay, id)
    else
      local lane = ARGV[o + 3]
      if filled[lane] then  -- the lane holds work and is on the ring: no need to look again
        redis.call('ZADD', lane_key(base, lane), -tonumber(ARGV[o + 2]), id)
      else
        lane_push(base, ring, id, lane, tonumber(ARGV[o + 2]))
        filled[lane] = true
      end
      ready = ready + 1
    end
    out[#out + 1] = id; out[#out + 1] = 'new'
  end
end
wake_workers(wake, ready)
return out
