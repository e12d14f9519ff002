--[[ extend: renew leases (the worker's heartbeat); token-fenced.
KEYS[1] base    prefix  emq:{q}; rows base:job:<id>
KEYS[2] active  ZSET    id -> lease deadline ms
ARGV[1..] jobs     n, then 3 per job: id, token, lease ms from now
A run with a time limit (a `deadline` on its row: claim.lua) is renewed to deadline + 1 s at most,
so a stuck worker's heartbeat cannot keep a run past its limit from the reaper.
Returns: per job 1 (renewed), 2 (renewed, and an operator asked to cancel it), 3 (not renewed:
        this very attempt has finished, its ack got there first) or 0 (stale: the lease is lost)
]]
-- uses: now_ms, job_key
local base, active, n = KEYS[1], KEYS[2], tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 0, n - 1 do
  local id, token, ms = ARGV[2 + i * 3], ARGV[3 + i * 3], tonumber(ARGV[4 + i * 3])
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'cancel', 'deadline')
  if row[1] == 'active' and row[2] == token then
    local lease_until = now + ms
    if row[4] then lease_until = math.min(lease_until, (tonumber(row[4]) or 0) + 1000) end
    redis.call('ZADD', active, 'XX', lease_until, id)
    redis.call('HSET', jk, 'lease_until', lease_until)
    out[#out + 1] = (row[3] == '1') and 2 or 1
  elseif row[2] == token and row[1] ~= 'pending' and row[1] ~= 'scheduled' then
    out[#out + 1] = 3
  else
    out[#out + 1] = 0
  end
end
return out
