--[[ checkpoint: store a running job's progress on its row (and optionally renew the lease).
KEYS[1] base    prefix  emq:{q}; rows base:job:<id>
KEYS[2] active  ZSET    id -> lease deadline ms
ARGV[1] job_id     the job
ARGV[2] token      the attempt's fencing token
ARGV[3] data       the progress (JSON)
ARGV[4] lease_ms   lease ms from now (0 = keep; a run with a `deadline` to deadline + 1 s at most:
        extend.lua)
Returns: 1 (stored) or 0 (stale)
]]
-- uses: job_key, now_ms
local base, active = KEYS[1], KEYS[2]
local id, token, data, ms = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local jk = job_key(base, id)
local row = redis.call('HMGET', jk, 'state', 'attempts', 'deadline')
if row[1] ~= 'active' or row[2] ~= token then return 0 end
redis.call('HSET', jk, 'checkpoint', data)
if ms > 0 then
  local deadline = now_ms() + ms
  if row[3] then deadline = math.min(deadline, (tonumber(row[3]) or 0) + 1000) end
  redis.call('ZADD', active, 'XX', deadline, id)
  redis.call('HSET', jk, 'lease_until', deadline)
end
return 1
