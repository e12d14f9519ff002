--[[ watch: a caller about to wait for a job's result reads its row and, while the job has not
finished, counts itself in the row's `notify` (finish() then pushes a token per waiter onto
base:notify:<id>, the list the caller BLPOPs): one atomic step, so a job that finishes between
the read and the wait still wakes it.
KEYS[1] base    prefix  emq:{q}; rows base:job:<id>
ARGV[1] job_id     the job
Returns: {'missing'} (no live row), {state, result, last_error} for a finished job, or {state}
        for a job not finished yet (the caller is counted as a waiter)
]]
-- uses: job_key
local base, id = KEYS[1], ARGV[1]
local jk = job_key(base, id)
local row = redis.call('HMGET', jk, 'state', 'result', 'last_error')
if not row[1] then return {'missing'} end
local s = row[1]
if s ~= 'pending' and s ~= 'scheduled' and s ~= 'active' and s ~= 'waiting' then
  return {s, row[2] or '', row[3] or ''}
end
redis.call('HINCRBY', jk, 'notify', 1)
return {s}
