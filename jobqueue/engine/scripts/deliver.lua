--[[ deliver: "member done" entries relayed from another shard's base:forward STREAM (a member
finished there; see forward and member_done in _flows.lua) applied to the jobs of this shard
that wait for it, as member_done applies them on the member's own shard: the outcome goes in the
job's slot, the member leaves the job's set of pending members (SREM: a replayed entry finds it
gone and changes nothing), the job is released once when its set empties, and a failed member's
policy is applied ('f' cancels the job, and what waits for it, here or forwarded on; 'i' leaves an
error object; 'c' releases it). Consecutive successes for one waiting job (a chord's callback
gets runs of them) are applied together, to the same end (successes_done in _flows.lua).
relay.py deletes an entry from its stream once this answered 1.
KEYS[1] base    prefix  emq:{q#k}; derives rows base:job:<id>, base:deps:<id>, base:results:<id>,
                        base:waiting, lanes base:pending / base:lane:<l>, base:ring, base:wake (a
                        job released), base:forward (a cancel forwarded on), and as a job is
                        cancelled base:hist, base:m:<minute>, base:uniq:<key>, base:uniqs,
                        base:notify:<id>, base:flow:<id>; base:done STREAM terminal events (a
                        job cancelled by its member's failure, or waiting again)
                        (a released dependent handed to an idle worker: base:idle,
                        base:hand:<name>, base:active; _handoff.lua)
KEYS[2] meta    HASH    counters n_<state>
ARGV[1] retention  ms a finished row is kept
ARGV[2..] entries  n, then 7 per entry: dependent id, slot, policy ('f' | 'i' | 'c'), member id,
        member's state ('succeeded' | 'dead' | 'cancelled' | 'expired'), value (the slot's JSON:
        its result, or an error object), token (the member's attempts when it ended; '' none:
        an entry written before tokens, applied as it is): an outcome older than the slot's last
        applied one changes nothing (fenced in _flows.lua)
Returns: {entries this call forwarded in turn (to relay from this shard), then per entry 1
        (applied, or nothing left to apply: a replay, an older outcome, a job no longer waiting),
        2 (applied, and the job a member's failure had cancelled waits again: the relay claims
        from this shard again, should a resize have retired it) or 0 (no such job here: one
        expired or deleted, or a node that lost data; the relay keeps the entry until it is
        stale)}
]]
-- uses: now_ms, job_key, edge_done, finish, successes_done
local base, meta = KEYS[1], KEYS[2]
local done = base .. ':done'
local retention, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, out, sent = now_ms(), {0}, 0

-- The entries from `i` on that are successes for the same job as entry `i` (a chord's
-- callback gets many in a row): their count.
local function run_length(i)
  local dep, j = ARGV[3 + i * 7], i
  while j < n and ARGV[3 + j * 7] == dep and ARGV[3 + j * 7 + 4] == 'succeeded' do j = j + 1 end
  return j - i
end

local i = 0
while i < n do
  local a = 3 + i * 7
  local dep, index, policy = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local dk = job_key(base, dep)
  local count = run_length(i)
  local bulk = false
  if count > 1 and redis.call('HGET', dk, 'state') == 'waiting' then
    local run = {}
    for k = 0, count - 1 do
      local b = a + k * 7
      run[#run + 1] = {ARGV[b + 3], ARGV[b + 1], ARGV[b + 5], ARGV[b + 6]}
    end
    bulk = successes_done(base, dep, run, now)
  end
  if bulk then
    for _ = 1, count do out[#out + 1] = 1 end
    i = i + count
  else
    if redis.call('EXISTS', dk) == 0 then
      out[#out + 1] = 0
    else
      local applied = edge_done(base, ARGV[a + 3], ARGV[a + 4], ARGV[a + 5], dep, index, policy,
        now, retention, ARGV[a + 6])
      if applied == 'cancel' then
        sent = sent + finish(base, done, meta, dk, dep, 'cancelled', now, retention)
      end
      out[#out + 1] = (applied == 'revived') and 2 or 1
    end
    i = i + 1
  end
end
out[1] = sent
return out
