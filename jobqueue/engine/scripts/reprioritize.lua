--[[ reprioritize (operator): change a job's priority in place; a pending job is rescored on its
lane, a scheduled, active or waiting one (a flow's, for its members) takes it when it is ready.
KEYS[1] base    prefix  emq:{q}; rows base:job:<id>, lanes base:pending / base:lane:<l>
ARGV[1] job_id     the job
ARGV[2] priority   -100…100
ARGV[3] call_id    the call's own id ('' = none): its answer is kept a minute in
        base:op:<call id>, so that the call sent again after its reply was lost answers as it
        did (a replay would find the job moved on)
Returns: 'ok:<state>', 'missing', or 'state:<state>' for a finished job
]]
-- uses: op_key, answered, job_key, lane_key
local base = KEYS[1]
local id, priority = ARGV[1], tonumber(ARGV[2])
local op = op_key(base, ARGV[3])
local seen = op and redis.call('GET', op)
if seen then return seen end
local jk = job_key(base, id)
local row = redis.call('HMGET', jk, 'state', 'lane')
if not row[1] then return answered(op, 'missing') end
if row[1] ~= 'pending' and row[1] ~= 'scheduled' and row[1] ~= 'active'
    and row[1] ~= 'waiting' then
  return answered(op, 'state:' .. row[1])
end
redis.call('HSET', jk, 'priority', priority)
if row[1] == 'pending' then redis.call('ZADD', lane_key(base, row[2]), 'XX', -priority, id) end
return answered(op, 'ok:' .. row[1])
