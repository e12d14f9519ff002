--[[ progress: store running jobs' progress (a JSON value) on their rows; token-fenced, so only
the holder of the current attempt writes it. The value stays on the row after the job ends.
KEYS[1] base    prefix  emq:{q}; rows base:job:<id>
ARGV[1..] jobs     n, then 3 per job: id, token, value (JSON)
Returns: per job 1 (stored) or 0 (stale: the attempt is over or another holds the job)
]]
-- uses: job_key
local base, n = KEYS[1], tonumber(ARGV[1])
local out = {}
for i = 0, n - 1 do
  local id, token, value = ARGV[2 + i * 3], ARGV[3 + i * 3], ARGV[4 + i * 3]
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts')
  if row[1] == 'active' and row[2] == token then
    redis.call('HSET', jk, 'progress', value)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
