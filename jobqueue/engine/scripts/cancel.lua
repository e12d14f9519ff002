--[[ cancel (operator): a waiting job (pending, scheduled, or waiting for its dependencies)
becomes cancelled at once; an active one is flagged, and its worker's ack, nack or release then
records it as cancelled. The jobs that depend on a cancelled one follow their failure policy.
A job cancelled while it waited for its dependencies keeps its sets (base:deps:<id>,
base:results:<id>, with its row's retention; `waited` on its row), which take its members'
outcomes still, so that a retry of it waits only for what is not done (retry.lua). A job that a
member's failure cancelled (`blocked_by`) would come back once an operator's retry of that member
succeeds (edge_done in _flows.lua): an operator's cancel of it makes its cancel final.
KEYS[1] base      prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                          base:lane:<l>, base:turns, base:capped, base:rated (a lane emptied),
                          base:waiting, base:deps:<id>, base:results:<id>, base:outcomes; as a
                          job finishes base:hist, base:m:<minute>, base:uniq:<key>, base:uniqs,
                          base:notify:<id>, base:flow:<id>, base:wake (a dependent released);
                          base:ring LIST lanes with ready work, base:done STREAM terminal
                          events
                          (a released dependent handed to an idle
                          worker: base:idle, base:hand:<name>,
                          base:active; _handoff.lua)
KEYS[2] schedule  ZSET    id -> due ms
KEYS[3] meta      HASH    counters
ARGV[1] job_id     the job
ARGV[2] retention  ms a finished row is kept
ARGV[3] call_id    the call's own id ('' = none): its answer is kept a minute in
        base:op:<call id>, so that the call sent again after its reply was lost answers as it
        did (a replay would find the job cancelled)
Returns: 'ok:cancelled' (also for a job a member's failure had cancelled: final now), 'ok:active'
         (flagged), 'missing', or 'state:<state>' when finished
]]
-- uses: op_key, job_key, answered, unready, finish, now_ms
local base, schedule, meta = KEYS[1], KEYS[2], KEYS[3]
local ring, done = base .. ':ring', base .. ':done'
local id = ARGV[1]
local op = op_key(base, ARGV[3])
local seen = op and redis.call('GET', op)
if seen then return seen end
local jk = job_key(base, id)
local row = redis.call('HMGET', jk, 'state', 'blocked_by')
local state, retention = row[1], tonumber(ARGV[2])
if not state then return answered(op, 'missing') end
if state == 'active' then
  redis.call('HSET', jk, 'cancel', '1')
  return answered(op, 'ok:active')
end
if state == 'pending' then
  unready(base, ring, jk, id)
elseif state == 'scheduled' then
  redis.call('ZREM', schedule, id)
elseif state == 'waiting' then
  redis.call('SREM', base .. ':waiting', id)
  redis.call('HSET', jk, 'waited', '1')
  for _, key in ipairs({base .. ':deps:' .. id, base .. ':results:' .. id}) do
    if retention and retention > 0 then redis.call('PEXPIRE', key, retention) end
  end
elseif state == 'cancelled' and row[2] and row[2] ~= '' then
  redis.call('HDEL', jk, 'blocked_by')
  return answered(op, 'ok:cancelled')
else
  return answered(op, 'state:' .. state)
end
finish(base, done, meta, jk, id, 'cancelled', now_ms(), retention)
return answered(op, 'ok:cancelled')
