--[[ nack: record a failed run; retry after backoff while the budget lasts, else dead.
KEYS[1] base      prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                          base:lane:<l>, base:slots, base:capped, base:rated (a slot freed),
                          and as a job finishes base:hist, base:m:<minute>, base:uniq:<key>,
                          base:uniqs, base:notify:<id>, base:flow:<id>, and for its
                          dependents base:deps:<id>, base:results:<id>, base:forward, base:waiting;
                          base:done STREAM terminal events, base:ring LIST lanes with ready
                          work, base:wake LIST wake tokens
KEYS[2] active    ZSET    id -> lease deadline ms
KEYS[3] schedule  ZSET    id -> due ms
KEYS[4] dead      ZSET    id -> finished ms
KEYS[5] meta      HASH    counters
ARGV[1] job_id          the job
ARGV[2] token           the attempt's fencing token
ARGV[3] error           error text
ARGV[4] retry_ms        retry in this many ms (-1 = the job's backoff)
ARGV[5] fatal           '1' = fatal (no retry)
ARGV[6] retention       ms a finished row is kept
ARGV[7] dead_retention  ms a dead row is kept
ARGV[8] max_attempts    the queue's max_attempts (for a row that holds none)
ARGV[9] backoff_ms      the queue's backoff ms (for a row that holds none)
Returns: the new state ('pending', 'scheduled', 'dead', 'cancelled'), or '' when stale; 'dead'
        and 'cancelled' end in ':forwarded' when the outcome went to dependents on other shards
        in base:forward (the worker relays it at once: relay.py). A nack this attempt's own nack
        recorded already (sent again after its reply was lost: the row's `nacked` is its token)
        answers as that one did.
]]
-- uses: job_key, now_ms, wake_workers, free_slot, finish, count_minute, observe, record_attempt
-- uses: make_ready
local base, active, schedule, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local done, ring, wake, meta = base .. ':done', base .. ':ring', base .. ':wake', KEYS[5]
local id, token, err, retry_in, fatal = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5]
local jk = job_key(base, id)
local row = redis.call('HMGET', jk, 'state', 'attempts', 'uncharged', 'max_attempts',
  'backoff_ms', 'cancel', 'started_at', 'slot', 'lane')
if row[1] ~= 'active' or row[2] ~= token then
  if row[2] ~= token or redis.call('HGET', jk, 'nacked') ~= token then return '' end
  if row[1] == 'pending' or row[1] == 'scheduled' then return row[1] end
  if row[1] ~= 'dead' and row[1] ~= 'cancelled' then return '' end
  local dependents = redis.call('HGET', jk, 'dependents')
  return row[1] .. ((dependents and string.find(dependents, '%w+:%d+:%a:%S')) and ':forwarded'
    or '')
end
local now = now_ms()
redis.call('ZREM', active, id)
wake_workers(wake, free_slot(base, ring, row[8], row[9]))
redis.call('HSET', jk, 'last_error', err, 'lease_until', '', 'nacked', token)
if row[6] == '1' then
  local sent = finish(base, done, meta, jk, id, 'cancelled', now, tonumber(ARGV[6]), nil, true)
  return (sent > 0) and 'cancelled:forwarded' or 'cancelled'
end
-- The budget counts runs, not claims: releases and operator retries are `uncharged`.
count_minute(base, now, 'failed')
local used = tonumber(row[2]) - (tonumber(row[3]) or 0)
if fatal == '1' or used >= (tonumber(row[4]) or tonumber(ARGV[8])) then
  redis.call('ZADD', dead, now, id)
  local sent = finish(base, done, meta, jk, id, 'dead', now, tonumber(ARGV[7]), nil, true)
  return (sent > 0) and 'dead:forwarded' or 'dead'
end
observe(base, row[7], now)  -- a failed run that will be retried (finish observes the others)
record_attempt(jk, row[2], err, now)
redis.call('HINCRBY', meta, 'n_failed', 1)
local delay = retry_in
if delay < 0 then
  delay = math.min((tonumber(row[5]) or tonumber(ARGV[9])) * 2 ^ (used - 1), 3600000)
end
if delay <= 0 then
  redis.call('HSET', jk, 'run_after', now)
  make_ready(base, ring, jk, id, now)
  wake_workers(wake, 1)
  return 'pending'
end
redis.call('HSET', jk, 'state', 'scheduled', 'run_after', now + delay)
redis.call('ZADD', schedule, now + delay, id)
return 'scheduled'
