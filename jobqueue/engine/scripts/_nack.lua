--[[ _nack: the failure of a claimed attempt recorded, token-fenced: nack.lua records one,
nack_many.lua a batch's (worker/batches.py) in one call. A failure retries after the job's
backoff while its budget lasts, else the job is dead; an operator's cancel wins. Touches what
finish() touches (_finish.lua), frees the slots of lane caps (free_slot, _lanes.lua) and puts a
retry due at once back on its lane (make_ready).
]]

-- Record one failed attempt. `q`: the call's queue-wide values: base, active, schedule, dead,
-- done, ring, meta (keys), retention, dead_retention, max_attempts, backoff_ms (the queue's,
-- for a row that holds none), now, and tallies (a batch's counters: nil to count at once).
-- Answers the new state ('pending', 'scheduled', 'dead', 'cancelled'; 'dead' and 'cancelled'
-- end in ':forwarded' when the outcome went to dependents on other shards), or '' when stale,
-- and how many wake tokens the call owes (a lane slot freed, a retry due now). A nack this
-- attempt's own nack recorded already (sent again after its reply was lost: the row's
-- `nacked` is its token) answers as that one did.
-- uses: job_key, free_slot, finish, count_minute, observe, record_attempt, make_ready, tally
local function nack_job(q, id, token, err, retry_in, fatal)
  local base, now, tallies = q.base, q.now, q.tallies
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'uncharged', 'max_attempts',
    'backoff_ms', 'cancel', 'started_at', 'slot', 'lane')
  if row[1] ~= 'active' or row[2] ~= token then
    if row[2] ~= token or redis.call('HGET', jk, 'nacked') ~= token then return '', 0 end
    if row[1] == 'pending' or row[1] == 'scheduled' then return row[1], 0 end
    if row[1] ~= 'dead' and row[1] ~= 'cancelled' then return '', 0 end
    local dependents = redis.call('HGET', jk, 'dependents')
    return row[1] .. ((dependents and string.find(dependents, '%w+:%d+:%a:%S'))
      and ':forwarded' or ''), 0
  end
  redis.call('ZREM', q.active, id)
  local wakes = free_slot(base, q.ring, row[8], row[9])
  redis.call('HSET', jk, 'last_error', err, 'lease_until', '', 'nacked', token)
  if row[6] == '1' then
    local sent = finish(base, q.done, q.meta, jk, id, 'cancelled', now, q.retention, nil, true,
      tallies)
    return (sent > 0) and 'cancelled:forwarded' or 'cancelled', wakes
  end
  -- The budget counts runs, not claims: releases and operator retries are `uncharged`.
  count_minute(base, now, 'failed', tallies)
  local used = tonumber(row[2]) - (tonumber(row[3]) or 0)
  if fatal or used >= (tonumber(row[4]) or q.max_attempts) then
    redis.call('ZADD', q.dead, now, id)
    local sent = finish(base, q.done, q.meta, jk, id, 'dead', now, q.dead_retention, nil, true,
      tallies)
    return (sent > 0) and 'dead:forwarded' or 'dead', wakes
  end
  observe(base, row[7], now, tallies)  -- a failed run that will be retried (finish observes the others)
  record_attempt(jk, row[2], err, now)
  tally(q.meta, 'n_failed', 1, nil, tallies)
  local delay = retry_in
  if delay < 0 then
    delay = math.min((tonumber(row[5]) or q.backoff_ms) * 2 ^ (used - 1), 3600000)
  end
  if delay <= 0 then
    redis.call('HSET', jk, 'run_after', now)
    make_ready(base, q.ring, jk, id, now)
    return 'pending', wakes + 1
  end
  redis.call('HSET', jk, 'state', 'scheduled', 'run_after', now + delay)
  redis.call('ZADD', q.schedule, now + delay, id)
  return 'scheduled', wakes
end
