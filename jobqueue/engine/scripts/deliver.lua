--[[ deliver: "member done" entries relayed from another shard's base:outcomes STREAM (members
finished there; see forward and member_done in _flows.lua), each a pack of outcomes, applied
to the jobs of this shard that wait for them, as member_done applies them on the member's own
shard: the outcome goes in the job's slot, the member leaves the job's set of pending members
(SREM: a replayed entry finds it gone and changes nothing), the job is released once when its
set empties, and a failed member's policy is applied ('f' cancels the job, and what waits for
it, here or forwarded on; 'i' leaves an error object; 'c' releases it). Consecutive successes
for one waiting job (a chord's callback gets runs of them) are applied together, to the same
end (successes_done in _flows.lua). relay.py deletes an entry from its stream once this
answered 1 for its pack.
KEYS[1] base    prefix  emq:{q#k}; derives rows base:job:<id>, base:deps:<id>, base:results:<id>,
                        base:waiting, lanes base:pending / base:lane:<l>, base:ring, base:wake (a
                        job released), base:outcomes (a cancel forwarded on), and as a job is
                        cancelled base:hist, base:m:<minute>, base:uniq:<key>, base:uniqs,
                        base:notify:<id>, base:flow:<id>; base:done STREAM terminal events (a
                        job cancelled by its member's failure, or waiting again)
                        (a released dependent handed to an idle worker: base:idle,
                        base:hand:<name>, base:active; _handoff.lua)
KEYS[2] meta    HASH    counters n_<state>
ARGV[1] retention  ms a finished row is kept
ARGV[2..] packs    n, then n packs (an entry's `pack`: JSON, a list of outcomes, each [dependent
        id, slot, policy ('f' | 'i' | 'c'), member id, member's state ('succeeded' | 'dead' |
        'cancelled' | 'expired'), value (the slot's JSON: its result, or an error object),
        token (the member's attempts when it ended; '' none: an outcome written before tokens,
        applied as it is)]): an outcome older than the slot's last applied one changes nothing
        (fenced in _flows.lua)
Returns: {entries this call forwarded in turn (to relay from this shard), 1 when a job a member's
        failure had cancelled waits again (the relay claims from this shard again, should a
        resize have retired it) else 0, then per pack 1 (each outcome applied, or nothing left
        to apply: a replay, an older outcome, a job no longer waiting), the places (from 1) of
        its outcomes whose job is not here (one expired or deleted, or a node that lost data:
        the relay keeps those until they are stale; the others were applied), or -1 (not a list
        of outcomes: nothing applied; the relay drops it)}
]]
-- uses: now_ms, job_key, edge_done, finish, successes_done
local base, meta = KEYS[1], KEYS[2]
local done = base .. ':done'
local retention, npacks = tonumber(ARGV[1]), tonumber(ARGV[2])
local now, sent, revived = now_ms(), 0, 0  -- (the reply's first two)

-- A pack decoded: its outcomes, or nil when it is not a list of outcomes of 7 strings.
local function decoded(text)
  local ok, pack = pcall(cjson.decode, text)
  if not ok or type(pack) ~= 'table' or #pack == 0 then return nil end
  for _, e in ipairs(pack) do
    if type(e) ~= 'table' or #e ~= 7 then return nil end
    for k = 1, 7 do
      if type(e[k]) ~= 'string' then return nil end
    end
  end
  return pack
end

-- Every pack's outcomes in one list, in order (`from`, `at`: each outcome's pack and its place
-- in it); a pack's answer: an empty list until an outcome of it finds no job (its place noted).
local E, from, at, out = {}, {}, {}, {0, 0}
for p = 1, npacks do
  local pack = decoded(ARGV[2 + p])
  out[2 + p] = pack and {} or -1
  for k, e in ipairs(pack or {}) do
    E[#E + 1] = e
    from[#E], at[#E] = p, k
  end
end

-- The outcomes from `i` on that are successes for the same job as outcome `i` (a chord's
-- callback gets many in a row): their count, at most RUN (successes_done unpacks 4 values an
-- outcome into one HSET: Lua's unpack takes ~8,000).
local RUN = 1000
local function run_length(i)
  local dep, j = E[i][1], i
  while j < #E and j - i + 1 < RUN and E[j + 1][1] == dep and E[j + 1][5] == 'succeeded' do
    j = j + 1
  end
  return j - i + 1
end

-- Outcome `k` applied alone.
local function apply_one(k)
  local dep, index, policy, member, state, value, token = unpack(E[k])
  local dk = job_key(base, dep)
  if redis.call('EXISTS', dk) == 0 then
    local absent = out[2 + from[k]]
    absent[#absent + 1] = at[k]
    return
  end
  local applied = edge_done(base, member, state, value, dep, index, policy, now, retention, token)
  if applied == 'cancel' then
    sent = sent + finish(base, done, meta, dk, dep, 'cancelled', now, retention)
  elseif applied == 'revived' then
    revived = 1
  end
end

-- A run of successes for one waiting job goes at once (successes_done); anything else, and a
-- run whose slots hold a failure mark, one by one.
local i = 1
while i <= #E do
  local dep, count = E[i][1], 1
  if E[i][5] == 'succeeded' and i < #E and E[i + 1][1] == dep
      and redis.call('HGET', job_key(base, dep), 'state') == 'waiting' then
    count = run_length(i)
    local run = {}
    for k = i, i + count - 1 do run[#run + 1] = {E[k][4], E[k][2], E[k][6], E[k][7]} end
    if successes_done(base, dep, run, now) then
      i, count = i + count, 0
    end
  end
  for k = i, i + count - 1 do apply_one(k) end
  i = i + count
end
for p = 1, npacks do  -- (an empty list is no reply: 1 for a pack applied whole)
  if type(out[2 + p]) == 'table' and #out[2 + p] == 0 then out[2 + p] = 1 end
end
out[1], out[2] = sent, revived
return out
