--[[ ack: record the success of claimed jobs; token-fenced, so a stale lease changes nothing.
KEYS[1] base    prefix  emq:{q}
KEYS[2] active  ZSET    id -> lease deadline ms
KEYS[3] done    STREAM  terminal events for the MySQL mirror
KEYS[4] meta    HASH    counters n_<state>
ARGV[1] retention ms of a finished row, ARGV[2] n, then 3 per job: id, token, result (JSON)
Returns: per job 1 (recorded: succeeded, or cancelled when an operator flagged it) or 0 (stale)
]]
local base, active, done, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local retention, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local out = {}
for i = 0, n - 1 do
  local id, token, result = ARGV[3 + i * 3], ARGV[4 + i * 3], ARGV[5 + i * 3]
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'cancel')
  if row[1] == 'active' and row[2] == token then
    redis.call('ZREM', active, id)
    finish(base, done, meta, jk, id, (row[3] == '1') and 'cancelled' or 'succeeded', now, retention,
      result)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
