--[[ reseal: key rotation (`operations.reseal`) writes back values sealed again under the first
key, each only if the field still holds the value read (a compare-and-set: a job that moved on
meanwhile keeps what it has, and a row that went is never written again).
KEYS[1] base    prefix  emq:{q}; rows base:job:<id>, flows' result slots base:results:<id>
ARGV[1] row        'job' (a job row) or 'results' (a flow's result slots)
ARGV[2] job_id     the job's (or the waiting job's) id
ARGV[3..] fields   n, then 3 per field: name, the value read, the value sealed again
Returns: how many fields hold the value sealed again (written now, or by an earlier send of
the same call: a replay answers as the first did)
]]
-- uses: job_key
local base, id, n = KEYS[1], ARGV[2], tonumber(ARGV[3])
local key = ARGV[1] == 'results' and base .. ':results:' .. id or job_key(base, id)
local written = 0
for i = 0, n - 1 do
  local name, read, new = ARGV[4 + i * 3], ARGV[5 + i * 3], ARGV[6 + i * 3]
  local now_there = redis.call('HGET', key, name)
  if now_there == read then
    redis.call('HSET', key, name, new)
    written = written + 1
  elseif now_there == new then
    written = written + 1
  end
end
return written
