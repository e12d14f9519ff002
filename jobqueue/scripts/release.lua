--[[ release: a stopping worker hands claimed jobs back without charging their retry budget.
The token stays spent (`attempts` is not lowered), so the releasing worker's late ack is refused.
KEYS[1] base    prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                        base:lane:<l>, base:slots, base:capped, base:rated (a slot freed), and
                        as a job finishes base:hist, base:m:<minute>, base:uniq:<key>,
                        base:uniqs, base:notify:<id>, base:flow:<id>, and for its dependents
                        base:deps:<id>, base:results:<id>, base:forward, base:waiting (_common.lua)
KEYS[2] active  ZSET    id -> lease deadline ms
KEYS[3] ring    LIST    lanes with ready work
KEYS[4] wake    LIST    wake tokens
KEYS[5] done    STREAM  terminal events
KEYS[6] meta    HASH    counters
ARGV[1] retention ms, ARGV[2] n, then 2 per job: id, token
Returns: per job 1 (released, or cancelled when flagged) or 0 (stale)
]]
local base, active, ring, wake, done, meta = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local retention, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local out, ready = {}, 0
for i = 0, n - 1 do
  local id, token = ARGV[3 + i * 2], ARGV[4 + i * 2]
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'cancel', 'uncharged', 'slot', 'lane')
  if row[1] == 'active' and row[2] == token then
    redis.call('ZREM', active, id)
    ready = ready + free_slot(base, ring, row[5], row[6])
    redis.call('HSET', jk, 'uncharged', (count_field(row[4]) or 0) + 1, 'lease_until', '',
      'worker', '')
    if row[3] == '1' then
      finish(base, done, meta, jk, id, 'cancelled', now, retention)
    else
      make_ready(base, ring, jk, id, now)
      ready = ready + 1
    end
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
wake_workers(wake, ready)
return out
