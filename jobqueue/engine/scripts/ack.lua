--[[ ack: record the success of claimed jobs; token-fenced, so a stale lease changes nothing.
(The worker's steady state sends its acks inside the next claim instead: claim.lua.)
KEYS[1] base    prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                        base:lane:<l>, base:slots, base:capped, base:rated (a slot freed), and
                        as a job finishes base:hist, base:m:<minute>, base:uniq:<key>,
                        base:uniqs, base:notify:<id>, base:flow:<id>, and for its dependents
                        base:deps:<id>, base:results:<id>, base:outcomes, base:waiting (_flows.lua);
                        base:done STREAM terminal events for the MySQL mirror, base:ring LIST
                        lanes with ready work (a lane held at its cap comes back when a slot
                        frees), base:wake LIST wake tokens (for such lanes: one push per call,
                        however many came back)
                        (a released dependent handed to an idle worker: base:idle,
                        base:hand:<name>; _handoff.lua)
KEYS[2] active  ZSET    id -> lease deadline ms
KEYS[3] meta    HASH    counters n_<state>
ARGV[1] retention  ms a finished row is kept
ARGV[2..] jobs     n, then 3 per job: id, token, result (JSON)
Returns: per job 1 (recorded succeeded), 3 (recorded cancelled: an operator flagged it), each
        plus 1 when outcomes were forwarded to dependents on other shards in base:outcomes
        (relay.py), or 0 (stale)
]]
-- uses: ack_jobs, wake_workers
local base = KEYS[1]
local out, back = ack_jobs(base, KEYS[2], base .. ':done', KEYS[3], base .. ':ring',
  tonumber(ARGV[1]), ARGV, 2)
wake_workers(base .. ':wake', back)
return out
