--[[ extend: renew leases (the worker's heartbeat); token-fenced.
KEYS[1] base    prefix  emq:{q}; rows base:job:<id>
KEYS[2] active  ZSET    id -> lease deadline ms
ARGV[1..] jobs     n, then 3 per job: id, token, lease ms from now (for a started run with a time
        limit '<lease ms>:<left ms>': the ms left until the worker's deadline for it)
A started run with a time limit gets a `deadline` on its row, now + left on the server clock (the
earlier wins when one is there: written by an earlier renewal of this run; claim.lua removes an
earlier attempt's), and is renewed to deadline + 1 s at most, so a stuck worker's heartbeat
cannot keep a run past its limit from the reaper (reap.lua: JobTimeout). A run not started yet
(prefetched: its limit counts from its start) is renewed as any other.
Returns: per job 1 (renewed), 2 (renewed, and an operator asked to cancel it), 3 (not renewed:
        this very attempt has finished, its ack got there first) or 0 (stale: the lease is lost)
]]
-- uses: now_ms, job_key
local base, active, n = KEYS[1], KEYS[2], tonumber(ARGV[1])
local now = now_ms()
local out = {}
for i = 0, n - 1 do
  local id, token, ms = ARGV[2 + i * 3], ARGV[3 + i * 3], ARGV[4 + i * 3]
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'cancel', 'deadline')
  if row[1] == 'active' and row[2] == token then
    local lease, left = tonumber(ms), nil
    if not lease then  -- '<lease ms>:<left ms>': a started run with a time limit
      lease, left = string.match(ms, '^(%d+):(%d+)$')
      lease = tonumber(lease) or 0
    end
    local lease_until = now + lease
    local deadline = tonumber(row[4] or '')
    if left and not (deadline and deadline <= now + tonumber(left)) then
      deadline = now + tonumber(left)
      redis.call('HSET', jk, 'deadline', deadline)
    end
    if deadline then lease_until = math.min(lease_until, deadline + 1000) end
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
