--[[ batch: note on running jobs' rows that they run together, in one call of a batch handler
(the worker groups them: worker/batches.py), and read their lanes; token-fenced, so only the
holder of the current attempt writes it. The note stays on the row after the job ends.
KEYS[1] base    prefix  emq:{q}; rows base:job:<id>
ARGV[1] mark            what each row's `batch` field becomes: '<n> <first job's id>'
ARGV[2..] jobs          n, then 2 per job: id, token
Returns: per job its lane ('' = the default lane), or 0 (stale: the attempt is over or another
holds the job)
]]
-- uses: job_key
local mark, n = ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 0, n - 1 do
  local id, token = ARGV[3 + i * 2], ARGV[4 + i * 2]
  local jk = job_key(KEYS[1], id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'lane')
  if row[1] == 'active' and row[2] == token then
    redis.call('HSET', jk, 'batch', mark)
    out[#out + 1] = row[3] or ''
  else
    out[#out + 1] = 0
  end
end
return out
