--[[ ack: record the success of claimed jobs; token-fenced, so a stale lease changes nothing.
(The worker's steady state sends its acks inside the next claim instead: claim.lua.)
KEYS[1] base    prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                        base:lane:<l>, base:slots, base:capped, base:rated (a slot freed), and
                        as a job finishes base:hist, base:m:<minute>, base:uniq:<key>,
                        base:uniqs, base:notify:<id>, base:flow:<id>, and for its dependents
                        base:deps:<id>, base:results:<id>, base:forward, base:waiting (_common.lua)
KEYS[2] active  ZSET    id -> lease deadline ms
KEYS[3] done    STREAM  terminal events for the MySQL mirror
KEYS[4] meta    HASH    counters n_<state>
KEYS[5] ring    LIST    lanes with ready work (a lane held at its cap comes back when a slot frees)
KEYS[6] wake    LIST    wake tokens (for such lanes: one push per call, however many came back)
ARGV[1] retention  ms a finished row is kept
ARGV[2..] jobs     n, then 3 per job: id, token, result (JSON)
Returns: per job 1 (recorded succeeded), 3 (recorded cancelled: an operator flagged it), each
        plus 1 when outcomes were forwarded to dependents on other shards in base:forward
        (relay.py), or 0 (stale)
]]
local out, back = ack_jobs(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], tonumber(ARGV[1]), 2)
wake_workers(KEYS[6], back)
return out
