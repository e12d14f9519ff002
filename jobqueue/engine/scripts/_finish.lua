--[[ _finish: how an attempt or a job ends: the terminal transition every script ends a job
through (finish: its state, counters, the `done` event for the MySQL mirror, its retention, the
callers awaiting it, the jobs that depend on it), a row too corrupt to run buried, a failed
attempt kept in the row's history.
  base:notify:<id>  LIST  wake tokens for the callers awaiting a job's result (refs.py), pushed
                          by finish() only when the row's `notify` counts waiters; expires
  base:flow:<id>    ZSET  a flow's jobs on this shard -> their position in it, kept as long as
                          the rows it lists
The `done` STREAM and the `dead` ZSET come from the caller; finish touches the keys of
_counters.lua, _keys.lua (a unique key let go) and, for a job others depend on, _flows.lua.
]]

-- An attempt that failed and will run again joins the row's `history` (the last ten): the job
-- page's timeline shows every attempt, the row's own fields holding the latest. An attempt's
-- error keeps its last 500 bytes: a traceback ends with the exception and its message.
-- uses: count_field
local function record_attempt(jk, attempt, err, now)
  local row = redis.call('HMGET', jk, 'worker', 'started_at', 'history')
  local ok, history = pcall(cjson.decode, row[3] or '[]')
  if not ok or type(history) ~= 'table' then history = {} end
  history[#history + 1] = {attempt = tonumber(attempt), worker = row[1] or '',
    started = count_field(row[2]) or 0, ended = now, error = string.sub(err or '', -500)}
  while #history > 10 do table.remove(history, 1) end
  redis.call('HSET', jk, 'history', cjson.encode(history))
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

-- The row's fields a terminal transition's `done` event carries (its non-empty ones).
local EVENT_FIELDS = {'attempts', 'priority', 'lane', 'payload', 'result', 'last_error',
  'enqueued_at', 'unique_key', 'worker', 'max_attempts', 'started_at', 'history', 'progress',
  'batch'}
-- uses: EVENT_FIELDS
local EVENT_AT = {}  -- field name -> its position in EVENT_FIELDS (and in the HMGET reply)
for i, name in ipairs(EVENT_FIELDS) do EVENT_AT[name] = i end
-- finish() reads these after the event's fields, in the same HMGET (so a job nobody waits on
-- costs no command more): how many callers await its result, the jobs that depend on it
-- ('<id>:<slot>:<policy>' …) and its flow.
-- uses: EVENT_FIELDS
local FOLLOW_AT = #EVENT_FIELDS
-- uses: EVENT_FIELDS
local FINISH_FIELDS = {unpack(EVENT_FIELDS)}
for _, name in ipairs({'notify', 'dependents', 'flow'}) do
  FINISH_FIELDS[#FINISH_FIELDS + 1] = name
end

-- A terminal transition: state, timestamps, counters, the `done` event for the MySQL mirror
-- (in this same script, so a state change can never miss its event) and the row's retention.
-- The event carries the row's non-empty fields, so the mirror needs nothing else. `ran`: an
-- attempt ran until this end (ack, nack, reap), so its duration goes in the histogram; a job
-- ended while it waited (expired, cancelled, buried) keeps `started_at` from an earlier run,
-- which would count the wait as a run. `tallies`: a batch's counters (_counters.lua), nil to
-- count at once. Returns how many outcomes went to dependents on other shards (base:outcomes):
-- this job's, and those of the jobs its end cancelled.
-- uses: FINISH_FIELDS, EVENT_FIELDS, tally, observe, EVENT_AT, count_minute, uniq_key, uniqs_key
-- uses: FOLLOW_AT, notify_waiters, keep_flow, member_done, job_key
local function finish(base, done, meta, jk, id, state, now, retention_ms, result, ran, tallies)
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
  tally(meta, 'n_' .. state, 1, nil, tallies)
  if ran then observe(base, f[EVENT_AT.started_at], now, tallies) end
  count_minute(base, now, state, tallies)
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
  if not f[FOLLOW_AT + 2] then return 0 end
  local doomed, sent = member_done(base, id, state, result, f[FOLLOW_AT + 2], now, retention_ms,
    nil, f[EVENT_AT.attempts] or '0')
  for _, dep in ipairs(doomed) do
    sent = sent + finish(base, done, meta, job_key(base, dep), dep, 'cancelled', now,
      retention_ms, nil, nil, tallies)
  end
  return sent
end

-- A row that cannot run (a field its transitions rely on is corrupt) goes dead, saying which.
-- uses: finish
local function bury(base, dead, done, meta, jk, id, field, now, retention_ms)
  redis.call('HSET', jk, 'last_error', 'corrupt field ' .. field .. ': the job cannot run',
    'lease_until', '')
  redis.call('ZADD', dead, now, id)
  finish(base, done, meta, jk, id, 'dead', now, retention_ms)
end
