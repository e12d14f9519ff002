--[[ promote: scheduled jobs that are due move to their lane, and lanes whose next token is due
(held back by their rate: claim.lua) go back on the ring. Idempotent; any worker runs it.
KEYS[1] base      prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                          base:lane:<l>, base:capped (a lane back from its rate, unless capped);
                          base:rated ZSET lanes held back by their rate: lane -> ms their next
                          token is due
KEYS[2] schedule  ZSET    id -> due ms
KEYS[3] ring      LIST    lanes with ready work
KEYS[4] wake      LIST    wake tokens
ARGV[1] limit      at most this many jobs
Returns: {promoted, ms until the next due job or lane token (-1 = none)}
]]
-- uses: now_ms, job_key, make_ready, STATES, lane_push, lane_back, wake_workers
local base, schedule, ring, wake = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local rated = base .. ':rated'
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', schedule, '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local moved, back = 0, 0
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
for _, lane in ipairs(redis.call('ZRANGEBYSCORE', rated, '-inf', now, 'LIMIT', 0,
    tonumber(ARGV[1]))) do
  redis.call('ZREM', rated, lane)
  back = back + lane_back(base, ring, lane)
end
wake_workers(wake, moved + back)
local wait = -1
for _, key in ipairs({schedule, rated}) do
  local nxt = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if nxt[2] then
    local ms = math.max(tonumber(nxt[2]) - now, 0)
    if wait < 0 or ms < wait then wait = ms end
  end
end
return {moved, wait}
