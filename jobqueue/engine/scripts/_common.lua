--[[ _common: helpers for the transition scripts; jobqueue/scripts/__init__.py prepends to each
script the top-level definitions it uses (with the comment lines right above each). They only
touch keys derived from a braced base key that the script received in KEYS, so every key stays
in the shard's slot:
  base:job:<id>     HASH  the job row
  base:pending      ZSET  the default lane; base:lane:<name> ZSET a named lane (id -> -priority)
  base:uniq:<key>   STRING unique_key -> id
  base:uniqs        SET   the unique keys whose job is live on this shard (a resize's settle
                          check reads it instead of scanning the keyspace)
  base:turns        HASH  turns a weighted lane has had in the ring's current round
  base:bucket       HASH  a rate-limited queue's token bucket (tokens, at ms)
  base:hist         HASH  run durations for the metrics: count per bucket (ms upper bound or
                          +Inf), sum_ms
  base:m:<minute>   HASH  outcomes per minute (succeeded, dead, cancelled, expired, failed), kept
                          2 hours
  base:notify:<id>  LIST  wake tokens for the callers awaiting a job's result (refs.py), pushed
                          by finish() only when the row's `notify` counts waiters; expires
  base:waiting      SET   jobs waiting for their dependencies (state 'waiting')
  base:deps:<id>    SET   a waiting job's members not yet done
  base:results:<id> HASH  a waiting job's members' outcomes by slot (JSON: a result, or an
                          error object for a member that failed under 'ignore' / 'continue')
  base:flow:<id>    ZSET  a flow's jobs on this shard -> their position in it (the console's
                          flow page merges every shard's)
  base:forward      STREAM "member done" entries for dependents on other shards of the queue
                          (dep, shard, slot, policy, member, state, value), until a relay
                          delivers them (deliver.lua, relay.py)
Tenant controls (claim.lua takes lanes off the ring; whatever frees a slot or a token puts them
back, so the ring holds the lanes with ready work that are not held back, and lanes that reached
their cap since a claim last met them):
  base:slots        HASH  lane -> its jobs active now that hold a slot of its cap (the claim marks
                          such a job's row `slot` = 1; the transition that ends the attempt frees
                          the slot once: the row's state and token fence it)
  base:capped       SET   lanes taken off the ring at their cap, with ready work
  base:rated        ZSET  lanes taken off the ring by their rate: lane -> ms their next token is due
  base:caps         HASH  lane ('*': every named lane) -> its cap, set live (set_lane_concurrency)
  base:lbucket:<l>  HASH  a rate-limited lane's token bucket (tokens, at ms), expiring when full
]]

-- Milliseconds on the server clock: leases and schedules never trust a worker's clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Any field of a row may be corrupt (hand-edited, bit-rotted): scripts read the fields they rely
-- on through these checks and bury a row that fails them, instead of raising mid-script (a
-- script error keeps its earlier writes, so it could strand jobs it had already popped).
local STATES = {pending = true, scheduled = true, active = true, succeeded = true, dead = true,
  cancelled = true, expired = true, waiting = true}

-- A non-negative integer field (at most 15 digits: exact as a Lua number), or nil.
local function count_field(v)
  if v and #v <= 15 and string.find(v, '^%d+$') then return tonumber(v) end
  return nil
end

local function valid_lane(lane)
  return lane == '' or (#lane <= 128 and not string.find(lane, '[^%w%._:%-]'))
end

local function valid_priority(v)
  local p = v and string.find(v, '^%-?%d%d?%d?$') and tonumber(v)
  return p and p >= -100 and p <= 100
end

local function job_key(base, id) return base .. ':job:' .. id end

local function uniq_key(base, unique) return base .. ':uniq:' .. unique end

local function uniqs_key(base) return base .. ':uniqs' end

-- The default lane ('') is `pending`; a named lane is `lane:<name>`.
local function lane_key(base, lane)
  if not lane or lane == '' then return base .. ':pending' end
  return base .. ':lane:' .. lane
end

-- Whether a lane is held off the ring: at its cap (base:capped) or out of tokens (base:rated).
local function held(base, lane)
  return redis.call('SISMEMBER', base .. ':capped', lane) == 1
    or redis.call('ZSCORE', base .. ':rated', lane) ~= false
end

-- Put a job on its lane (score -priority: ZPOPMIN serves the highest priority, then the lowest
-- id, i.e. mint order) and keep the ring = exactly the lanes that have ready work and are not
-- held back by their cap or rate (a held lane always has ready work: `unready` lets go of one
-- it empties, so a lane that gets its first job here is never held).
local function lane_push(base, ring, id, lane, priority)
  local lk = lane_key(base, lane)
  if redis.call('ZADD', lk, -priority, id) == 1 and redis.call('ZCARD', lk) == 1 then
    redis.call('RPUSH', ring, lane)
  end
end

-- A lane no longer held back goes back on the ring if it has ready work (and is not held for
-- the other reason). Returns 1 when it did: the caller wakes a worker for it.
local function lane_back(base, ring, lane)
  if redis.call('ZCARD', lane_key(base, lane)) == 0 or held(base, lane) then return 0 end
  redis.call('RPUSH', ring, lane)
  return 1
end

-- Wake up to `n` blocked workers; the list is capped so idle queues do not accumulate tokens.
local function wake_workers(wake, n)
  if n <= 0 then return end
  local tokens = {}
  for i = 1, math.min(n, 16) do tokens[i] = '1' end
  if redis.call('RPUSH', wake, unpack(tokens)) > 16 then redis.call('LTRIM', wake, -16, -1) end
end

-- An attempt ends: if the claim counted it against its lane's cap (`slot` on the row), its slot
-- is freed, once: every caller acts only for the attempt's own token while the row is active,
-- and moves the row out of `active` in the same call. (The field stays on the row: the claim
-- that leases the job again rewrites or drops it.) A lane held at its cap comes back on the
-- ring without `lane_back`'s checks, which its hold answers: it has ready work (`unready` lets
-- go of a held lane it empties), and it is held for its cap alone (a claim holds a lane for one
-- reason, and only a lane on the ring meets a claim). Returns 1 when it came back, so the
-- caller wakes a worker for it, once per call for all the slots it freed (one push, not one
-- per lane).
local function free_slot(base, ring, slot, lane)
  if slot ~= '1' then return 0 end
  lane = lane or ''
  local slots = base .. ':slots'
  if redis.call('HINCRBY', slots, lane, -1) <= 0 then redis.call('HDEL', slots, lane) end
  if redis.call('SREM', base .. ':capped', lane) == 0 then return 0 end
  redis.call('RPUSH', ring, lane)
  return 1
end

-- Counters (outcome totals, per-minute counts, the duration histogram): HINCRBY at once, or,
-- while a batch of acks is recorded, summed and written once per field when it ends.
local tally_batch = nil
local function tally(key, field, n, ttl)
  if tally_batch then
    local slot = key .. '\n' .. field
    local t = tally_batch[slot]
    if t then t[3] = t[3] + n else tally_batch[slot] = {key, field, n, ttl} end
    return
  end
  if redis.call('HINCRBY', key, field, n) == n and ttl then redis.call('EXPIRE', key, ttl) end
end

local function flush_tally()
  local batch = tally_batch
  tally_batch = nil
  for _, t in pairs(batch) do tally(t[1], t[2], t[3], t[4]) end
end

-- Count an outcome in this minute's bucket (the dashboard's charts, kept two hours).
local function count_minute(base, now, what)
  tally(base .. ':m:' .. math.floor(now / 60000), what, 1, 7200)
end

-- The same for a job whose row already exists: it becomes pending. A corrupt lane or priority
-- puts it on the default lane, where the claim that pops it buries it with the reason.
local function make_ready(base, ring, jk, id, now)
  local row = redis.call('HMGET', jk, 'lane', 'priority')
  local lane, priority = row[1] or '', 0
  if not valid_lane(lane) then lane = '' end
  if valid_priority(row[2]) then priority = tonumber(row[2]) end
  redis.call('HSET', jk, 'state', 'pending', 'run_after', now)
  lane_push(base, ring, id, lane, priority)
end

-- Take a waiting job off its lane; an emptied lane leaves the ring, or stops being held back.
-- Returns the lane.
local function unready(base, ring, jk, id)
  local lane = redis.call('HGET', jk, 'lane') or ''
  local lk = lane_key(base, lane)
  if redis.call('ZREM', lk, id) == 1 and redis.call('ZCARD', lk) == 0 then
    redis.call('LREM', ring, 0, lane)
    redis.call('HDEL', base .. ':turns', lane)
    redis.call('SREM', base .. ':capped', lane)
    redis.call('ZREM', base .. ':rated', lane)
  end
  return lane
end

-- An attempt that failed and will run again joins the row's `history` (the last ten): the job
-- page's timeline shows every attempt, the row's own fields holding the latest.
local function record_attempt(jk, attempt, err, now)
  local row = redis.call('HMGET', jk, 'worker', 'started_at', 'history')
  local ok, history = pcall(cjson.decode, row[3] or '[]')
  if not ok or type(history) ~= 'table' then history = {} end
  history[#history + 1] = {attempt = tonumber(attempt), worker = row[1] or '',
    started = count_field(row[2]) or 0, ended = now, error = string.sub(err or '', 1, 500)}
  while #history > 10 do table.remove(history, 1) end
  redis.call('HSET', jk, 'history', cjson.encode(history))
end

-- A run's duration into the shard's histogram (Prometheus' jobqueue_job_duration_seconds).
local DURATION_BUCKETS = {5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
  300000}
local function observe(base, started, now)
  local ms = count_field(started)
  if not ms then return end
  ms = math.max(now - ms, 0)
  local le = '+Inf'
  for _, bound in ipairs(DURATION_BUCKETS) do
    if ms <= bound then le = tostring(bound); break end
  end
  tally(base .. ':hist', le, 1)
  tally(base .. ':hist', 'sum_ms', ms)
end

-- Wake the callers awaiting a job's result: one token each (`notify` counts them; a caller that
-- gave up leaves a token nobody takes, gone when the list expires).
local function notify_waiters(base, jk, id, waiters)
  local key = base .. ':notify:' .. id
  local tokens = {}
  for i = 1, math.min(tonumber(waiters) or 1, 1000) do tokens[i] = '1' end
  redis.call('RPUSH', key, unpack(tokens))
  redis.call('PEXPIRE', key, 60000)
  redis.call('HDEL', jk, 'notify')
end

-- A flow's index lives at least as long as the rows of the jobs it lists.
local function keep_flow(base, flow, retention_ms)
  local key = base .. ':flow:' .. flow
  if retention_ms and retention_ms > 0 and redis.call('PTTL', key) < retention_ms then
    redis.call('PEXPIRE', key, retention_ms)
  end
end

-- A payload with `arg` (JSON text) as its first argument: spliced into its own (top-level) args,
-- or given args of its own when it has none (a step of kwargs only). The scan for its args jumps
-- from one string or bracket to the next (string.find skips the rest), so a key named "args"
-- inside a kwarg, or the text of a string, is never taken for them. A payload that is no JSON
-- object stays as it is (the worker that claims it says what is wrong with it). (One function:
-- the acks and claims that carry it define it at every call, and only a release runs it.)
local function with_first_arg(payload, arg)
  local depth, at, b = 0, 1, nil
  while not b do
    local s, _, c = string.find(payload, '(["{}%[%]])', at)
    if not s then break end
    if c == '"' then
      local e = s + 1
      while true do  -- to the string's closing quote, over its escapes
        local q = string.find(payload, '["\\]', e)
        if not q then return payload end
        if string.byte(payload, q) == 92 then e = q + 2 else e = q; break end
      end
      at = e + 1
      if depth == 1 and e - s == 5 and string.sub(payload, s + 1, e - 1) == 'args' then
        b = select(2, string.find(payload, '^%s*:%s*%[', at))
      end
    else
      depth = depth + ((c == '{' or c == '[') and 1 or -1)
      at = s + 1
    end
  end
  if not b then
    local rest = string.match(payload, '^%s*{(.*)$')
    if not rest then return payload end
    return '{"args":[' .. arg .. ']' .. (string.find(rest, '^%s*}') and '' or ',') .. rest
  end
  local rest = string.sub(payload, b + 1)
  if string.find(rest, '^%s*]') then return string.sub(payload, 1, b) .. arg .. rest end
  return string.sub(payload, 1, b) .. arg .. ',' .. rest
end

-- A waiting job whose dependencies are done becomes pending: its members' outcomes go in as its
-- first argument ('first': the one slot, a chain's step; 'list': every slot in order, a
-- chord's callback), and its flow keys go. (Also an operator's retry of a job cancelled while it
-- waited, once its members are done.)
local function release_job(base, dep, now)
  local dk = job_key(base, dep)
  local row = redis.call('HMGET', dk, 'payload', 'takes', 'slots')
  local rk = base .. ':results:' .. dep
  if row[2] == 'first' or row[2] == 'list' then
    local arg = redis.call('HGET', rk, '0') or 'null'
    if row[2] == 'list' then
      local slots = {}
      for i = 0, (count_field(row[3]) or 0) - 1 do
        slots[#slots + 1] = redis.call('HGET', rk, tostring(i)) or 'null'
      end
      arg = '[' .. table.concat(slots, ',') .. ']'
    end
    redis.call('HSET', dk, 'payload', with_first_arg(row[1] or '{}', arg))
  end
  redis.call('HDEL', dk, 'takes', 'slots', 'blocked_by', 'waited', 'finished_at')
  redis.call('PERSIST', dk)
  redis.call('DEL', rk, base .. ':deps:' .. dep)
  redis.call('SREM', base .. ':waiting', dep)
  make_ready(base, base .. ':ring', dk, dep, now)
  wake_workers(base .. ':wake', 1)
end

-- A finished member's outcome as it goes in a dependent's slot: its result (JSON), or for a
-- member that failed an error object naming it (`err`: its last error when Valkey lacks its row).
local function outcome_slot(base, id, state, result, err)
  if state == 'succeeded' then return result or 'null' end
  err = err or redis.call('HGET', job_key(base, id), 'last_error') or ''
  return cjson.encode({error = string.sub(err, -1000), state = state, job = id})
end

-- How many "member done" entries this call wrote to base:forward (the ack's answer flags them, so
-- the worker relays at once: relay.py).
local forwarded = 0

-- A member finished and a job waiting on it lives on another shard (`shard`) of the queue: the
-- outcome waits in this shard's base:forward STREAM (written in the member's own script call, so
-- it is as durable as the outcome) until a relay delivers it there (deliver.lua) and deletes it.
-- `token`: the member's attempts when it ended (see fenced).
local function forward(base, dep, shard, index, policy, id, state, slot, token)
  redis.call('XADD', base .. ':forward', '*', 'dep', dep, 'shard', shard, 'slot', index,
    'policy', policy, 'member', id, 'state', state, 'value', slot, 'token', token or '')
  forwarded = forwarded + 1
end

-- Whether an outcome for slot `index` of a dependent (its results hash `rk`) is older than the
-- one applied last: `token` is the member's attempts when it ended (a fencing token that never
-- goes back: an operator's retry runs it as the next attempt), kept as field 't<slot>'. So a
-- relay that read an entry before another relay delivered it, and a retry's newer outcome after,
-- cannot deliver the old one over it. An outcome without one (a durable row's) is applied.
local function fenced(rk, index, token)
  local t = tonumber(token)
  if not t then return false end
  local seen = tonumber(redis.call('HGET', rk, 't' .. index))
  if seen and seen > t then return true end
  redis.call('HSET', rk, 't' .. index, t)
  return false
end

-- How many jobs this call brought back to waiting (see edge_done): deliver.lua answers it per
-- entry, so the relay claims from the dependent's shard again if a resize retired it meanwhile.
local revived = 0

-- One edge member -> dependent, the dependent on this shard: it takes the member's outcome into
-- its slot and drops the member from its set of pending members (a set: a replayed finish or a
-- replayed delivery removes nothing twice, so it releases nothing twice); a job whose set
-- empties is released here. A member that failed (dead, cancelled, expired) cancels the job
-- under policy 'f' (fail), leaves an error object in the slot under 'i' (ignore), and releases
-- it at once under 'c' (continue); under 'f' it stays in the set, its slot marked failed
-- ('f<slot>' in the results hash, counted in 'failed'), until a retry of it succeeds. A job
-- cancelled while it waited (by an operator or by a member's failure: `waited`, or `blocked_by`
-- on a row written before it) keeps its sets, with its row's retention, and takes every outcome
-- still, so that a retry of it waits only for what is not done (retry.lua; a failure under 'c'
-- that reached it marks it 'go': it runs at once then). One a member's failure cancelled
-- (`blocked_by`) comes back once no failed member holds it (the member an operator retried has
-- succeeded): waiting again, its `done` event saying so (a durable row reopens with it, and a
-- restore brings it back waiting for what its members have not done: its payload is still the
-- one their outcomes have not been put into); an operator's cancel stays.
-- An outcome older than the slot's last (`token`: fenced) changes nothing. Returns true when the
-- job is to be cancelled (the caller's finish() does, and so on down the flow).
local function edge_done(base, id, state, slot, dep, index, policy, now, retention_ms, token)
  local ok = state == 'succeeded'
  local dk, pending, rk = job_key(base, dep), base .. ':deps:' .. dep, base .. ':results:' .. dep
  local row = redis.call('HMGET', dk, 'state', 'blocked_by', 'waited', 'flow')
  local blocked = (row[2] or '') ~= ''
  local kept = row[1] == 'cancelled' and (row[3] == '1' or blocked)
  if (row[1] ~= 'waiting' and not kept) or fenced(rk, index, token) then return false end
  if not ok and policy == 'f' then
    if redis.call('HSETNX', rk, 'f' .. index, 1) == 1 then
      redis.call('HINCRBY', rk, 'failed', 1)
    end
    if not kept then
      redis.call('HSET', dk, 'last_error', 'dependency ' .. id .. ' ended ' .. state,
        'blocked_by', id, 'waited', '1')
      redis.call('SREM', base .. ':waiting', dep)
      if retention_ms and retention_ms > 0 then
        redis.call('PEXPIRE', pending, retention_ms)
        redis.call('PEXPIRE', rk, retention_ms)
      end
      return true
    end
  else
    if redis.call('HDEL', rk, 'f' .. index) == 1 then redis.call('HINCRBY', rk, 'failed', -1) end
    redis.call('HSET', rk, index, slot)
    local removed = redis.call('SREM', pending, id) == 1
    local ready = (not ok and policy == 'c') or redis.call('SCARD', pending) == 0
    if not kept then
      if removed and ready then release_job(base, dep, now) end
      return false
    end
    if not ok and policy == 'c' then  -- (it runs at once when it comes back, or is retried)
      redis.call('HSET', rk, 'go', '1')
    end
    ready = ready or redis.call('HEXISTS', rk, 'go') == 1
    if blocked and (tonumber(redis.call('HGET', rk, 'failed')) or 0) <= 0 then  -- it comes back
      redis.call('HSET', dk, 'state', 'waiting')
      redis.call('HDEL', dk, 'blocked_by', 'waited', 'finished_at')
      redis.call('PERSIST', dk)
      redis.call('PERSIST', pending)
      redis.call('PERSIST', rk)
      if row[4] then redis.call('PERSIST', base .. ':flow:' .. row[4]) end
      redis.call('SADD', base .. ':waiting', dep)
      redis.call('XADD', base .. ':done', '*', 'id', dep, 'revived_at', now,
        unpack(redis.call('HGETALL', dk)))
      revived = revived + 1
      if ready then release_job(base, dep, now) end
      return false
    end
  end
  local ttl = redis.call('PTTL', dk)  -- (its sets go with its row)
  if ttl > 0 then
    redis.call('PEXPIRE', rk, ttl)
    redis.call('PEXPIRE', pending, ttl)
  end
  return false
end

-- A member of a flow finished: each job waiting on it (`dependents`: '<id>:<slot>:<policy>' for
-- one on this shard, '<id>:<slot>:<policy>:<shard>' for one on another shard of the queue) has
-- the outcome applied here, in the member's own script call (edge_done), or forwarded to its
-- shard (forward). Returns the jobs of this shard to cancel. `err`: a failed member's last error
-- when its row is not in Valkey (a durable queue's restore); `token`: its attempts, which a
-- forwarded outcome carries to be fenced there (one applied here, in the member's own call,
-- cannot be stale: it needs no fence).
local function member_done(base, id, state, result, dependents, now, retention_ms, err, token)
  local doomed = {}
  local slot = outcome_slot(base, id, state, result, err)
  for dep, index, policy, shard in string.gmatch(dependents, '(%w+):(%d+):(%a):?(%d*)') do
    if shard ~= '' then
      forward(base, dep, shard, index, policy, id, state, slot, token)
    elseif edge_done(base, id, state, slot, dep, index, policy, now, retention_ms) then
      doomed[#doomed + 1] = dep
    end
  end
  return doomed
end

-- A terminal transition: state, timestamps, counters, the `done` event for the MySQL mirror
-- (in this same script, so a state change can never miss its event) and the row's retention.
-- The event carries the row's non-empty fields, so the mirror needs nothing else. `ran`: an
-- attempt ran until this end (ack, nack, reap), so its duration goes in the histogram; a job
-- ended while it waited (expired, cancelled, buried) keeps `started_at` from an earlier run,
-- which would count the wait as a run.
local EVENT_FIELDS = {'attempts', 'priority', 'lane', 'payload', 'result', 'last_error',
  'enqueued_at', 'unique_key', 'worker', 'max_attempts', 'started_at', 'history', 'progress'}
local EVENT_AT = {}  -- field name -> its position in EVENT_FIELDS (and in the HMGET reply)
for i, name in ipairs(EVENT_FIELDS) do EVENT_AT[name] = i end
-- finish() reads these after the event's fields, in the same HMGET (so a job nobody waits on
-- costs no command more): how many callers await its result, the jobs that depend on it
-- ('<id>:<slot>:<policy>' …) and its flow.
local FOLLOW_AT = #EVENT_FIELDS
local FINISH_FIELDS = {unpack(EVENT_FIELDS)}
for _, name in ipairs({'notify', 'dependents', 'flow'}) do
  FINISH_FIELDS[#FINISH_FIELDS + 1] = name
end
local function finish(base, done, meta, jk, id, state, now, retention_ms, result, ran)
  if result then
    redis.call('HSET', jk, 'state', state, 'finished_at', now, 'lease_until', '', 'result', result)
  else
    redis.call('HSET', jk, 'state', state, 'finished_at', now, 'lease_until', '')
  end
  local f = redis.call('HMGET', jk, unpack(FINISH_FIELDS))
  local event = {'id', id, 'state', state, 'finished_at', now}
  for i, name in ipairs(EVENT_FIELDS) do
    if f[i] and f[i] ~= '' then event[#event + 1] = name; event[#event + 1] = f[i] end
  end
  redis.call('XADD', done, '*', unpack(event))
  tally(meta, 'n_' .. state, 1)
  if ran then observe(base, f[EVENT_AT.started_at], now) end
  count_minute(base, now, state)
  -- (a debounced key may name a newer job already: then the key is that job's, not ours)
  local unique = f[EVENT_AT.unique_key]
  local uk = unique and unique ~= '' and uniq_key(base, unique)
  local owner = uk and redis.call('GET', uk)
  if uk and (owner == id or not owner) then redis.call('SREM', uniqs_key(base), unique) end
  if retention_ms and retention_ms > 0 then
    redis.call('PEXPIRE', jk, retention_ms)
    if owner == id then redis.call('PEXPIRE', uk, retention_ms) end
  end
  if f[FOLLOW_AT + 1] then notify_waiters(base, jk, id, f[FOLLOW_AT + 1]) end
  if f[FOLLOW_AT + 3] then keep_flow(base, f[FOLLOW_AT + 3], retention_ms) end
  if f[FOLLOW_AT + 2] then
    local doomed = member_done(base, id, state, result, f[FOLLOW_AT + 2], now, retention_ms,
      nil, f[EVENT_AT.attempts] or '0')
    for _, dep in ipairs(doomed) do
      finish(base, done, meta, job_key(base, dep), dep, 'cancelled', now, retention_ms)
    end
  end
end

-- A row that cannot run (a field its transitions rely on is corrupt) goes dead, saying which.
local function bury(base, dead, done, meta, jk, id, field, now, retention_ms)
  redis.call('HSET', jk, 'last_error', 'corrupt field ' .. field .. ': the job cannot run',
    'lease_until', '')
  redis.call('ZADD', dead, now, id)
  finish(base, done, meta, jk, id, 'dead', now, retention_ms)
end

-- Record successes of claimed jobs, token-fenced: ARGV[at] = n, then id, token, result (JSON)
-- per job. Answers per job: 1 recorded succeeded, 3 recorded cancelled (an operator flagged
-- it), each plus 1 when it forwarded outcomes to dependents on other shards (the worker relays
-- them at once: relay.py), or 0 (stale: the lease was lost and the job may have run again
-- elsewhere); an ack this attempt's own ack recorded already (sent again after its reply was
-- lost) answers as that one did; and how many lanes
-- held at their cap came back on the ring (the caller wakes workers for them). `now`: the
-- caller's clock reading, if it has one.
local function ack_jobs(base, active, done, meta, ring, retention, at, now)
  if tonumber(ARGV[at]) == 0 then return {}, 0 end  -- (an idle worker's claim brings none)
  now = now or now_ms()
  local out, back = {}, 0
  tally_batch = {}
  for i = 0, tonumber(ARGV[at]) - 1 do
    local id, token, result = ARGV[at + 1 + i * 3], ARGV[at + 2 + i * 3], ARGV[at + 3 + i * 3]
    local jk = job_key(base, id)
    local row = redis.call('HMGET', jk, 'state', 'attempts', 'cancel', 'slot', 'lane')
    if row[1] == 'active' and row[2] == token then
      local before = forwarded
      redis.call('ZREM', active, id)
      back = back + free_slot(base, ring, row[4], row[5])
      local cancelled = row[3] == '1'
      if cancelled then redis.call('HSET', jk, 'acked', token) end  -- (see below)
      finish(base, done, meta, jk, id, cancelled and 'cancelled' or 'succeeded', now,
        retention, result, true)
      out[#out + 1] = (cancelled and 3 or 1) + ((forwarded > before) and 1 or 0)
    elseif row[2] == token and (row[1] == 'succeeded' or (row[1] == 'cancelled'
        and redis.call('HGET', jk, 'acked') == token)) then
      -- this very ack, sent again after its reply was lost: answered as it was (plus 1 when it
      -- forwarded to a dependent on another shard)
      local dependents = redis.call('HGET', jk, 'dependents')
      local sent = (dependents and string.find(dependents, '%w+:%d+:%a:%d+')) and 1 or 0
      out[#out + 1] = ((row[1] == 'cancelled') and 3 or 1) + sent
    else
      out[#out + 1] = 0
    end
  end
  flush_tally()
  return out, back
end
