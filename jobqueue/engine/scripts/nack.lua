--[[ nack: record a failed run; retry after backoff while the budget lasts, else dead.
KEYS[1] base      prefix  emq:{q}; derives rows base:job:<id>, lanes base:pending /
                          base:lane:<l>, base:slots, base:capped, base:rated (a slot freed),
                          and as a job finishes base:hist, base:m:<minute>, base:uniq:<key>,
                          base:uniqs, base:notify:<id>, base:flow:<id>, and for its
                          dependents base:deps:<id>, base:results:<id>, base:outcomes, base:waiting;
                          base:done STREAM terminal events, base:ring LIST lanes with ready
                          work, base:wake LIST wake tokens
                          (a released dependent handed to an idle
                          worker: base:idle, base:hand:<name>;
                          _handoff.lua)
KEYS[2] active    ZSET    id -> lease deadline ms
KEYS[3] schedule  ZSET    id -> due ms
KEYS[4] dead      ZSET    id -> finished ms
KEYS[5] meta      HASH    counters
ARGV[1] job_id          the job
ARGV[2] token           the attempt's fencing token
ARGV[3] error           error text
ARGV[4] retry_ms        retry in this many ms (-1 = the job's backoff)
ARGV[5] fatal           '1' = fatal (no retry)
ARGV[6] retention       ms a finished row is kept
ARGV[7] dead_retention  ms a dead row is kept
ARGV[8] max_attempts    the queue's max_attempts (for a row that holds none)
ARGV[9] backoff_ms      the queue's backoff ms (for a row that holds none)
Returns: the new state ('pending', 'scheduled', 'dead', 'cancelled'), or '' when stale; 'dead'
        and 'cancelled' end in ':forwarded' when the outcome went to dependents on other shards
        in base:outcomes (the worker relays it at once: relay.py). A nack this attempt's own nack
        recorded already (sent again after its reply was lost: the row's `nacked` is its token)
        answers as that one did.
]]
-- uses: now_ms, wake_workers, nack_job
local base = KEYS[1]
local q = {base = base, active = KEYS[2], schedule = KEYS[3], dead = KEYS[4],
  done = base .. ':done', ring = base .. ':ring', meta = KEYS[5], retention = tonumber(ARGV[6]),
  dead_retention = tonumber(ARGV[7]), max_attempts = tonumber(ARGV[8]),
  backoff_ms = tonumber(ARGV[9]), now = now_ms()}
local state, wakes = nack_job(q, ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5] == '1')
wake_workers(base .. ':wake', wakes)
return state
