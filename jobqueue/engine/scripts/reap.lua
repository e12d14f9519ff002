--[[ reap: jobs whose lease expired (their worker died or stalled) go back to waiting, or to
dead when their budget is spent, freeing the slot of their lane's cap they held; also forgets
dead entries older than their retention. A job an enqueue handed to an idle worker that never
took it (the worker died while its offer stood: the job is still on its hand-off list, which
outlives the lease for this) goes back uncharged, as a release would: nobody ran it.
KEYS[1] base    prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                        base:lane:<l>, base:slots, base:capped, base:rated (a slot freed), and
                        as a job finishes base:hist, base:m:<minute>, base:uniq:<key>,
                        base:uniqs, base:notify:<id>, base:flow:<id>, and for its dependents
                        base:deps:<id>, base:results:<id>, base:outcomes, base:waiting
                        (_flows.lua); an idle worker's hand-off list base:hand:<name>;
                        base:done STREAM terminal events, base:ring LIST lanes with ready
                        work, base:wake LIST wake tokens, base:schedule ZSET a timed-out run's
                        retry after its backoff
                        (a released dependent handed to an idle worker: base:idle,
                        base:hand:<name>; _handoff.lua)
KEYS[2] active  ZSET    id -> lease deadline ms
KEYS[3] dead    ZSET    id -> finished ms
KEYS[4] meta    HASH    counters
ARGV[1] limit           at most this many expired leases
ARGV[2] retention       ms a finished row is kept
ARGV[3] dead_retention  ms a dead row is kept
ARGV[4] max_attempts    the queue's max_attempts (for a row that holds none)
ARGV[5] backoff_ms      the queue's backoff ms (for a row that holds none)
A run past its time limit (its row's `deadline`, written by the renewal of the started run:
extend.lua) is recorded failed with a jobqueue.exceptions.JobTimeout (its worker did not end it:
stuck, stopped or dead), counted as nack.lua counts a failed run, and retried after the job's
backoff, as nack.lua retries a failure; any other expired lease (a row without a deadline: the
run was not started, or its worker died before its first renewal) is retried at once.
Returns: how many expired leases were handled
]]
-- uses: now_ms, job_key, free_slot, count_field, bury, finish, make_ready, record_attempt, STATES
-- uses: lane_push, wake_workers, count_minute, observe
local base, active, dead, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local done, ring, wake = base .. ':done', base .. ':ring', base .. ':wake'
local limit, retention, dead_retention = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', dead, '-inf', now - dead_retention)
local expired = redis.call('ZRANGEBYSCORE', active, '-inf', now, 'LIMIT', 0, limit)
local ready = 0

-- Whether job `id` still waits on `worker`'s hand-off list (then it is taken off it).
local function never_taken(id, worker)
  if not worker or worker == '' then return false end
  local hand = base .. ':hand:' .. worker
  for _, entry in ipairs(redis.call('LRANGE', hand, 0, -1)) do
    if string.sub(entry, 1, #id + 1) == id .. '|' then
      redis.call('LREM', hand, 1, entry)
      return true
    end
  end
  return false
end

for _, id in ipairs(expired) do
  redis.call('ZREM', active, id)
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'uncharged', 'max_attempts', 'cancel',
    'slot', 'lane', 'worker', 'deadline', 'backoff_ms', 'started_at')
  if row[1] == 'active' then
    ready = ready + free_slot(base, ring, row[6], row[7])
    local attempts = count_field(row[2])
    if not attempts then
      bury(base, dead, done, meta, jk, id, 'attempts', now, dead_retention)
    elseif never_taken(id, row[8]) then
      redis.call('HSET', jk, 'uncharged', (count_field(row[3]) or 0) + 1, 'lease_until', '',
        'worker', '')
      if row[5] == '1' then
        finish(base, done, meta, jk, id, 'cancelled', now, retention)
      else
        make_ready(base, ring, jk, id, now)
        ready = ready + 1
      end
    else
      local err, timed_out = 'lease expired', row[9] and now >= (tonumber(row[9]) or now)
      if timed_out then
        err = 'jobqueue.exceptions.JobTimeout: the run passed its timeout and its worker did ' ..
          'not end it (reaped)'
      end
      redis.call('HSET', jk, 'last_error', err, 'lease_until', '')
      if timed_out and row[5] ~= '1' then count_minute(base, now, 'failed') end  -- (as nack.lua)
      if row[5] == '1' then
        finish(base, done, meta, jk, id, 'cancelled', now, retention, nil, true)
      elseif attempts - (count_field(row[3]) or 0)
          >= (count_field(row[4]) or tonumber(ARGV[4])) then
        redis.call('ZADD', dead, now, id)
        finish(base, done, meta, jk, id, 'dead', now, dead_retention, nil, true)
      else
        record_attempt(jk, row[2], err, now)
        if timed_out then  -- a failed run that will be retried (finish observes the others)
          observe(base, row[11], now)
          redis.call('HINCRBY', meta, 'n_failed', 1)
        end
        local used = attempts - (count_field(row[3]) or 0)
        local delay = timed_out and math.min((count_field(row[10]) or tonumber(ARGV[5]))
          * 2 ^ (used - 1), 3600000) or 0
        if delay > 0 then
          redis.call('HSET', jk, 'state', 'scheduled', 'run_after', now + delay)
          redis.call('ZADD', base .. ':schedule', now + delay, id)
        else
          make_ready(base, ring, jk, id, now)
          ready = ready + 1
        end
      end
    end
  elseif row[1] and not STATES[row[1]] then
    lane_push(base, ring, id, '', 0)  -- the claim that pops it buries it, naming the field
    ready = ready + 1
  end
end
wake_workers(wake, ready)
return #expired
