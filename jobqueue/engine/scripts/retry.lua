--[[ retry (operator): a dead, cancelled or expired job goes back to pending with a fresh retry
budget (an expired one without its expiry).
`attempts` keeps counting (the fencing token never goes back); `uncharged` absorbs the old runs.
A job cancelled while it waited for its dependencies (by an operator, or by a member's failure:
`waited`, or `blocked_by` on a row written before it; its sets took its members' outcomes since)
waits again for the members that are not done (a member that failed under 'fail' counts as not
done: it waits for a retry of it to succeed), or, all done (or one failed under 'continue'), is
released with their outcomes as any dependent is (release_job).
KEYS[1] base    prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                        base:lane:<l>, unique keys base:uniq:<key>, base:uniqs, and a flow's
                        base:deps:<id>, base:results:<id>, base:waiting; base:ring LIST lanes
                        with ready work, base:wake LIST wake tokens
                        (a released dependent handed to an idle worker: base:idle,
                        base:hand:<name>, base:active, base:meta; _handoff.lua)
KEYS[2] dead    ZSET    id -> finished ms
ARGV[1] job_id     the job
ARGV[2] call_id    the call's own id ('' = none): its answer is kept a minute in
        base:op:<call id>, so that the call sent again after its reply was lost answers as it
        did (a replay would find the job pending)
Returns: 'ok:pending', 'ok:waiting', 'missing', 'state:<current state>' when the state does not
        allow it, or 'corrupt:attempts' when the row's attempts is unreadable
]]
-- uses: op_key, answered, job_key, count_field, uniq_key, uniqs_key, now_ms, release_job
-- uses: make_ready, wake_workers
local base, dead = KEYS[1], KEYS[2]
local ring, wake = base .. ':ring', base .. ':wake'
local id = ARGV[1]
local op = op_key(base, ARGV[2])
local seen = op and redis.call('GET', op)
if seen then return seen end
local jk = job_key(base, id)
local row = redis.call('HMGET', jk, 'state', 'attempts', 'unique_key', 'waited', 'blocked_by')
if not row[1] then return answered(op, 'missing') end
if row[1] ~= 'dead' and row[1] ~= 'cancelled' and row[1] ~= 'expired' then
  return answered(op, 'state:' .. row[1])
end
-- The fencing token must never go back, so a job whose count is unreadable cannot run again.
if row[2] and not count_field(row[2]) then return answered(op, 'corrupt:attempts') end
redis.call('ZREM', dead, id)
redis.call('PERSIST', jk)
if row[3] and row[3] ~= '' and redis.call('GET', uniq_key(base, row[3])) == id then
  redis.call('PERSIST', uniq_key(base, row[3]))
  redis.call('SADD', uniqs_key(base), row[3])
end
local now = now_ms()
redis.call('HSET', jk, 'uncharged', row[2] or 0, 'cancel', '0', 'finished_at', '', 'run_after', now)
redis.call('HDEL', jk, 'expires_at')
local deps = base .. ':deps:' .. id
if row[4] == '1' or (row[5] and row[5] ~= '') then
  if redis.call('SCARD', deps) == 0
      or redis.call('HEXISTS', base .. ':results:' .. id, 'go') == 1 then
    release_job(base, id, now)
    return answered(op, 'ok:pending')
  end
  redis.call('HSET', jk, 'state', 'waiting')
  redis.call('HDEL', jk, 'blocked_by', 'waited')
  redis.call('PERSIST', deps)
  redis.call('PERSIST', base .. ':results:' .. id)
  redis.call('SADD', base .. ':waiting', id)
  return answered(op, 'ok:waiting')
end
make_ready(base, ring, jk, id, now)
wake_workers(wake, 1)
return answered(op, 'ok:pending')
