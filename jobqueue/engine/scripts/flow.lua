--[[ flow: write a flow's jobs of one shard in one step: jobs without dependencies become ready
(or scheduled), the others wait (state 'waiting') until every job they depend on is done. Each
dependency is an edge member -> dependent: the member's row lists its dependents, the
dependent's base:deps:<id> SET holds its members not yet done; finish() walks the edges (see
member_done in _flows.lua). A member on this shard must be written earlier in this call, live
here, or come with its outcome (a durable queue's member that finished and that Valkey no longer
holds: its database row's); one that already finished is applied at once. A member on another
shard is only named in the dependent's set here: its edge is written by a link in the call on
its own shard (graph.py sends that call once the dependent is written). A link adds the edge
'<dep>:<slot>:<policy>:<shard>' (`shard`: another shard's index, or '<queue>#<index>' for a
shard of another queue: a flow across queues) to a member of this shard (written in this call, or held here,
finished or not: a retry of it may succeed; once only), and for a member that finished already
(or has a given outcome) forwards that outcome at once (base:outcomes, relay.py). A link whose
dependent's shard is '' names a dependent of this shard written by an earlier call (the member
was placed here after a resize turned its first call away): its edge is a same-shard one, its
outcome applied here.
KEYS[1] base      prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                          base:lane:<l>, base:flow:<id>, base:deps:<id>, base:results:<id>,
                          base:outcomes (outcomes for dependents on other shards), and
                          as a job finishes at once base:hist, base:m:<minute>, base:uniq:<key>,
                          base:uniqs, base:notify:<id>; base:ring LIST lanes with ready
                          work, base:wake LIST wake tokens, base:done STREAM terminal events (a
                          job cancelled at once: a member had failed), base:waiting SET jobs
                          waiting for their dependencies
                          (a released dependent handed to an idle
                          worker: base:idle, base:hand:<name>,
                          base:active; _handoff.lua)
KEYS[2] schedule  ZSET    id -> due ms
KEYS[3] meta      HASH    'draining' (the shard takes no new jobs), 'listed'
ARGV[1] flow_id    the flow's id ('' = none: no base:flow:<id> index)
ARGV[2] retention  ms a finished row is kept
ARGV[3] mode       'new' (a job id already taken refuses the call) or 'again' (a durable
        queue's rows sent again by a push, a relay or a restore: a job Valkey holds already is
        left as it is)
ARGV[4..] jobs     n, then per job: id, payload (JSON), priority, lane, max_attempts and
        backoff_ms ('' = the queue's), lease_ms, delay_ms, takes ('' | 'first' | 'list': what
        its members' outcomes become, see release_job), slots (how many), position (in the
        flow's index), d = number of members, then 4 per member: id, slot, policy ('f' fail |
        'i' ignore | 'c' continue), its shard ('' this one, else the other shard it is on: its
        index, or '<queue>#<index>' on another queue), then its expires_ms (0 = never; else the row's expires_at = now + it, which
        the claim checks), then spent (0, or the tokens a durable job's runs may have used
        before Valkey lost its data: its attempts go on past them, uncharged)
ARGV[..] outcomes  k = number of outcomes, then 3 per outcome: member id, state ('succeeded' |
        'dead' | 'cancelled' | 'expired'), value (its result as JSON when it succeeded, else its
        last error): used only for a member Valkey does not hold
ARGV[..] links     l = number of links, then 5 per link: member id (of this shard), dependent id,
        slot, policy, the dependent's shard ('' this one, its index on this queue, or
        '<queue>#<index>' on another queue)
Returns: {1 when the shard's meta says 'listed' else 0, 'ok', jobs written, entries forwarded},
        or {0, 'moved'} (the shard is draining and jobs were to be written: re-read the
        layout), {0, 'exists', id} (mode 'new': a job id already taken), {0, 'missing', id} (a
        member that is neither in this call, nor live here, nor given an outcome); nothing is
        written then. A call of mode 'new' that wrote jobs keeps its answer a minute in
        base:op:flow:<its first job's id>: sent again after its reply was lost, it finds that
        answer and gives it, instead of finding its own jobs taken.
]]
-- uses: job_key, now_ms, lane_push, member_done, finish, wake_workers
local base, schedule, meta = KEYS[1], KEYS[2], KEYS[3]
local ring, wake, done, waiting = base .. ':ring', base .. ':wake', base .. ':done',
  base .. ':waiting'
local flow, retention, again, n = ARGV[1], tonumber(ARGV[2]), ARGV[3] == 'again', tonumber(ARGV[4])
local flags = redis.call('HMGET', meta, 'draining', 'listed')
if flags[1] and n > 0 then return {0, 'moved'} end
local op = not again and n > 0 and base .. ':op:flow:' .. ARGV[5]
local seen = op and redis.call('GET', op)
if seen then return cjson.decode(seen) end

-- The outcomes of members Valkey may no longer hold, by id; where the links start.
local known, o = {}, 5
for _ = 1, n do o = o + 14 + tonumber(ARGV[o + 11]) * 4 end
for i = 0, tonumber(ARGV[o]) - 1 do
  known[ARGV[o + 1 + i * 3]] = {ARGV[o + 2 + i * 3], ARGV[o + 3 + i * 3]}
end
local links = o + 1 + tonumber(ARGV[o]) * 3

-- The jobs as {at = first ARGV index, d = members, kept = Valkey holds it already}, checked
-- before anything is written.
local jobs, mine = {}, {}
o = 5
for _ = 1, n do
  local d = tonumber(ARGV[o + 11])
  local kept = redis.call('EXISTS', job_key(base, ARGV[o])) == 1
  if kept and not again then return {0, 'exists', ARGV[o]} end
  jobs[#jobs + 1] = {at = o, d = d, kept = kept}
  for m = 0, d - 1 do
    local member = ARGV[o + 12 + m * 4]
    if not kept and ARGV[o + 15 + m * 4] == '' and not mine[member] and not known[member]
        and redis.call('EXISTS', job_key(base, member)) == 0 then
      return {0, 'missing', member}
    end
  end
  mine[ARGV[o]] = true
  o = o + 14 + d * 4
end
for i = 0, tonumber(ARGV[links]) - 1 do
  local member = ARGV[links + 1 + i * 5]
  if not mine[member] and not known[member]
      and redis.call('EXISTS', job_key(base, member)) == 0 then
    return {0, 'missing', member}
  end
end

local now, ready, written, finished, forwarded = now_ms(), 0, 0, {}, 0
local function put(row, name, value, default)
  if value ~= default then row[#row + 1] = name; row[#row + 1] = value end
end
local function write_job(job)
  local a = job.at
  local id, delay = ARGV[a], tonumber(ARGV[a + 7])
  local state = (job.d > 0) and 'waiting' or ((delay > 0) and 'scheduled' or 'pending')
  local row = {'state', state, 'payload', ARGV[a + 1], 'enqueued_at', now}
  put(row, 'priority', ARGV[a + 2], '0'); put(row, 'lane', ARGV[a + 3], '')
  put(row, 'max_attempts', ARGV[a + 4], ''); put(row, 'backoff_ms', ARGV[a + 5], '')
  put(row, 'lease_ms', ARGV[a + 6], '0'); put(row, 'flow', flow, '')
  put(row, 'takes', ARGV[a + 8], ''); put(row, 'slots', ARGV[a + 9], '0')
  if state == 'scheduled' then put(row, 'run_after', now + delay, nil) end
  local expires = tonumber(ARGV[a + 12 + job.d * 4])
  if expires > 0 then put(row, 'expires_at', now + expires, nil) end
  local spent = ARGV[a + 13 + job.d * 4]
  put(row, 'attempts', spent, '0'); put(row, 'uncharged', spent, '0')
  redis.call('HSET', job_key(base, id), unpack(row))
  if flow ~= '' then redis.call('ZADD', base .. ':flow:' .. flow, ARGV[a + 10], id) end
  for m = 0, job.d - 1 do
    local member, slot, policy = ARGV[a + 12 + m * 4], ARGV[a + 13 + m * 4], ARGV[a + 14 + m * 4]
    local mk, edge = job_key(base, member), id .. ':' .. slot .. ':' .. policy
    redis.call('SADD', base .. ':deps:' .. id, member)
    local before = ARGV[a + 15 + m * 4] == '' and redis.call('HMGET', mk, 'dependents', 'state',
      'result', 'attempts')
    local outcome = before and not before[2] and known[member]
    if not before then  -- on another shard: its link there writes the edge
    elseif outcome then  -- finished, gone from Valkey: its database row's outcome, applied below
      local ok = outcome[1] == 'succeeded'
      finished[#finished + 1] = {member, outcome[1], ok and outcome[2] or nil, edge,
        not ok and outcome[2] or nil}
    else
      redis.call('HSET', mk, 'dependents', before[1] and (before[1] .. ' ' .. edge) or edge)
      if before[2] ~= 'pending' and before[2] ~= 'scheduled' and before[2] ~= 'active'
          and before[2] ~= 'waiting' then  -- finished already: applied below, once all is written
        finished[#finished + 1] = {member, before[2], before[3], edge, nil, before[4] or '0'}
      end
    end
  end
  if state == 'waiting' then
    redis.call('SADD', waiting, id)
  elseif state == 'scheduled' then
    redis.call('ZADD', schedule, now + delay, id)
  else
    lane_push(base, ring, id, ARGV[a + 3], tonumber(ARGV[a + 2]))
    ready = ready + 1
  end
end
for _, job in ipairs(jobs) do
  if not job.kept then written = written + 1; write_job(job) end
end
-- A member's end cancels the jobs its failure dooms; what it and they forwarded is counted.
local function member_ended(member, state, result, edges, err, token)
  local doomed, sent = member_done(base, member, state, result, edges, now, retention, err, token)
  forwarded = forwarded + sent
  for _, dep in ipairs(doomed) do
    forwarded = forwarded + finish(base, done, meta, job_key(base, dep), dep, 'cancelled', now,
      retention)
  end
end
for _, f in ipairs(finished) do member_ended(f[1], f[2], f[3], f[4], f[5], f[6]) end
-- The links: an edge on the member's row (once), and for a member that has finished already its
-- outcome applied now (to a dependent of this shard: shard '') or forwarded. (The edge is written
-- on a finished member too: an operator's retry of a failed one that then succeeds brings back
-- the dependent its failure cancelled.)
for i = 0, tonumber(ARGV[links]) - 1 do
  local at = links + 1 + i * 5
  local member, dep, slot, policy, shard = ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3],
    ARGV[at + 4]
  local mk = job_key(base, member)
  local edge = dep .. ':' .. slot .. ':' .. policy .. (shard ~= '' and (':' .. shard) or '')
  local row = redis.call('HMGET', mk, 'state', 'dependents', 'result', 'attempts')
  if row[1] and not row[2] then
    redis.call('HSET', mk, 'dependents', edge)
  elseif row[1] and not string.find(' ' .. row[2] .. ' ', ' ' .. edge .. ' ', 1, true) then
    redis.call('HSET', mk, 'dependents', row[2] .. ' ' .. edge)
  end
  if row[1] ~= 'pending' and row[1] ~= 'scheduled' and row[1] ~= 'active'
      and row[1] ~= 'waiting' then
    local k = row[1] and {row[1], row[3]} or known[member]
    local ok = k[1] == 'succeeded'
    local err = not row[1] and not ok and k[2] or nil
    member_ended(member, k[1], ok and k[2] or nil, edge, err, row[1] and (row[4] or '0') or nil)
  end
end
wake_workers(wake, ready)
local answer = {flags[2] and 1 or 0, 'ok', written, forwarded}
if op then redis.call('SET', op, cjson.encode(answer), 'PX', 60000) end
return answer
