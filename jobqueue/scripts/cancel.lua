--[[ cancel (operator): a waiting job (pending, scheduled, or waiting for its dependencies)
becomes cancelled at once; an active one is flagged, and its worker's ack, nack or release then
records it as cancelled. The jobs that depend on a cancelled one follow their failure policy.
KEYS[1] base      prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                          base:lane:<l>, base:turns, base:capped, base:rated (a lane emptied),
                          base:waiting, base:deps:<id>, base:results:<id>, base:forward; as a
                          job finishes base:hist, base:m:<minute>, base:uniq:<key>, base:uniqs,
                          base:notify:<id>, base:flow:<id>, base:wake (a dependent released)
KEYS[2] schedule  ZSET    id -> due ms
KEYS[3] ring      LIST    lanes with ready work
KEYS[4] done      STREAM  terminal events
KEYS[5] meta      HASH    counters
ARGV[1] id, ARGV[2] retention ms, ARGV[3] the call's own id ('' = none): its answer is kept a
minute in base:op:<call id>, so that the call sent again after its reply was lost answers as
it did (a replay would find the job cancelled)
Returns: 'ok:cancelled', 'ok:active' (flagged), 'missing', or 'state:<state>' when finished
]]
local base, schedule, ring, done, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]
local op = (ARGV[3] or '') ~= '' and base .. ':op:' .. ARGV[3]
local seen = op and redis.call('GET', op)
if seen then return seen end
local jk = job_key(base, id)
local state = redis.call('HGET', jk, 'state')
if not state then return 'missing' end
if state == 'active' then
  redis.call('HSET', jk, 'cancel', '1')
  if op then redis.call('SET', op, 'ok:active', 'PX', 60000) end
  return 'ok:active'
end
if state == 'pending' then
  unready(base, ring, jk, id)
elseif state == 'scheduled' then
  redis.call('ZREM', schedule, id)
elseif state == 'waiting' then
  redis.call('SREM', base .. ':waiting', id)
  redis.call('DEL', base .. ':deps:' .. id, base .. ':results:' .. id)
else
  return 'state:' .. state
end
finish(base, done, meta, jk, id, 'cancelled', now_ms(), tonumber(ARGV[2]))
if op then redis.call('SET', op, 'ok:cancelled', 'PX', 60000) end
return 'ok:cancelled'
