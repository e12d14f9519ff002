--[[ promote: scheduled jobs that are due move to their lane. Idempotent; any worker runs it.
KEYS[1] base      prefix  emq:{q}
KEYS[2] schedule  ZSET    id -> due ms
KEYS[3] ring      LIST    lanes with ready work
KEYS[4] wake      LIST    wake tokens
ARGV[1] limit
Returns: {promoted, ms until the next due job (-1 = none scheduled)}
]]
local base, schedule, ring, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', schedule, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local moved = 0
for _, id in ipairs(due) do
  redis.call('ZREM', schedule, id)
  local jk = job_key(base, id)
  local state = redis.call('HGET', jk, 'state')
  if state == 'scheduled' then
    make_ready(base, ring, jk, id, now)
    moved = moved + 1
  elseif state and not STATES[state] then
    lane_push(base, ring, id, '', 0)  -- the claim that pops it buries it, naming the field
    moved = moved + 1
  end
end
wake_workers(wake, moved)
local nxt = redis.call('ZRANGE', schedule, 0, 0, 'WITHSCORES')
local wait = -1
if nxt[2] then wait = math.max(tonumber(nxt[2]) - now, 0) end
return {moved, wait}
