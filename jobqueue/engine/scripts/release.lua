--[[ release: a stopping worker hands claimed jobs back without charging their retry budget.
The token stays spent (`attempts` is not lowered), so the releasing worker's late ack is refused.
KEYS[1] base    prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                        base:lane:<l>, base:slots, base:capped, base:rated (a slot freed), and
                        as a job finishes base:hist, base:m:<minute>, base:uniq:<key>,
                        base:uniqs, base:notify:<id>, base:flow:<id>, and for its dependents
                        base:deps:<id>, base:results:<id>, base:outcomes, base:waiting (_flows.lua);
                        base:ring LIST lanes with ready work, base:wake LIST wake tokens,
                        base:done STREAM terminal events
                        (a released dependent handed to an idle worker: base:idle,
                        base:hand:<name>; _handoff.lua)
KEYS[2] active  ZSET    id -> lease deadline ms
KEYS[3] meta    HASH    counters
ARGV[1] retention  ms a finished row is kept
ARGV[2..] jobs     n, then 2 per job: id, token; or n = 0, then a worker's name and a claim's
        id: every job that claim leased to that worker (claim.lua marks them), which never
        reached it (the claim's reply was lost): the budget counts runs, and nobody ran them;
        or an idle wait's offer id, whose reply was lost: the job handed over then
        (_handoff.lua marks it so) also leaves the worker's list base:hand:<name>, if its
        BLPOP did not take it (a later wait would run it again)
Returns: per job 1 (released, or cancelled when flagged; also when this release already did:
        a replay after a lost reply) or 0 (stale); for a lost claim, how many it handed back
]]
-- uses: now_ms, job_key, free_slot, count_field, finish, make_ready, wake_workers
local base, active, meta = KEYS[1], KEYS[2], KEYS[3]
local ring, wake, done = base .. ':ring', base .. ':wake', base .. ':done'
local retention, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = now_ms()
local out, ready = {}, 0
local jobs = {}
if n == 0 and ARGV[4] then  -- (rare: a scan of the shard's leases)
  for _, id in ipairs(redis.call('ZRANGE', active, 0, -1)) do
    local r = redis.call('HMGET', job_key(base, id), 'worker', 'claim', 'attempts')
    if r[1] == ARGV[3] and r[2] == ARGV[4] then jobs[#jobs + 1] = {id, r[3]} end
  end
  if #jobs > 0 then
    local hand = base .. ':hand:' .. ARGV[3]
    for _, entry in ipairs(redis.call('LRANGE', hand, 0, -1)) do
      for _, job in ipairs(jobs) do
        if string.sub(entry, 1, #job[1] + 1) == job[1] .. '|' then
          redis.call('LREM', hand, 1, entry)
        end
      end
    end
  end
else
  for i = 0, n - 1 do jobs[#jobs + 1] = {ARGV[3 + i * 2], ARGV[4 + i * 2]} end
end
for _, job in ipairs(jobs) do
  local id, token = job[1], job[2]
  local jk = job_key(base, id)
  local row = redis.call('HMGET', jk, 'state', 'attempts', 'cancel', 'uncharged', 'slot', 'lane',
    'worker')
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
  elseif row[2] == token and row[7] == '' and (row[1] == 'pending' or row[1] == 'cancelled') then
    out[#out + 1] = 1  -- released by this very call, sent again after its reply was lost
  else
    out[#out + 1] = 0
  end
end
wake_workers(wake, ready)
if n == 0 and ARGV[4] then return #jobs end
return out
